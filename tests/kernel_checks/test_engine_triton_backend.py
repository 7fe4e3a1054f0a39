"""The whole engine with Triton attention gives the torch backend's greedy tokens.

Exercises the kernels as the model runner calls them: prefill, decode, chunked prefill
(small token budget) and prefix caching (blocks shared between prompts).
"""

from __future__ import annotations

import importlib

import pytest
import torch
from tiny_checkpoint import write_tiny_checkpoint

from engine import kernels
from engine.core.llm_engine import LLM
from engine.sampling import SamplingParams

SHARED = list(range(3, 40))  # 37 tokens: two full 16-token blocks are shared


def make_prompts() -> list[list[int]]:
    prompts = []
    for i in range(6):
        tail = [(7 * i + j) % 200 + 3 for j in range(2 + 5 * i)]
        prompts.append(SHARED + tail if i % 2 else tail)
    return prompts


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    # A large init std gives clear top-1 margins, so greedy tokens compare exactly.
    root = tmp_path_factory.mktemp("triton-engine")
    return write_tiny_checkpoint(root / "qwen3", arch="qwen3", seed=3, init_std=0.5)


def generate(path, device, backend, **settings):
    llm = LLM(
        path,
        progress=False,
        device=device.type,
        dtype="float32",
        attention_backend=backend,
        **settings,
    )
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = [out.token_ids for out in llm.generate(make_prompts(), params)]
    return outputs, llm.engine.stats.snapshot()


@pytest.mark.parametrize(
    "settings",
    [
        {"enable_prefix_caching": False},
        {"enable_prefix_caching": True, "max_num_batched_tokens": 16, "max_num_seqs": 3},
    ],
    ids=["plain", "chunked+prefix-cache"],
)
def test_triton_backend_matches_torch_backend(checkpoint, device, settings):
    expected, _ = generate(checkpoint, device, "torch", **settings)
    actual, stats = generate(checkpoint, device, "triton", **settings)
    assert all(len(tokens) == 12 for tokens in actual)
    assert actual == expected
    if settings["enable_prefix_caching"]:
        assert stats["prefix_cache_hits"] > 0


def test_importing_triton_modules_keeps_the_dispatchers_callable():
    # A submodule named like a dispatcher function would replace it on the package.
    modules = ("kv_store", "triton_paged_attention", "triton_rms_norm", "triton_silu_and_mul")
    for module in (*modules, "triton_rope"):
        importlib.import_module(f"engine.kernels.{module}")
    for name in ("paged_attention", "store_kv", "rms_norm", "silu_and_mul", "rotary_embedding"):
        assert callable(getattr(kernels, name)), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: graphs, overlap")
def test_cuda_graphs_and_async_scheduling_match_eager_synchronous_steps(checkpoint, device):
    """On a GPU: decode graphs per (size, KV splits) and step N+1 launched before step N is
    read back give the tokens of eager, synchronous steps."""
    expected, _ = generate(
        checkpoint, device, "triton", enforce_eager=True, async_scheduling=False, max_num_seqs=8
    )
    llm = LLM(
        checkpoint,
        progress=False,
        device=device.type,
        dtype="float32",
        attention_backend="triton",
        max_num_seqs=8,
    )
    assert llm.engine.async_scheduling
    decode = llm.engine.runner.decode
    assert decode is not None and decode.graphs  # captured, with more than one split count
    assert len({splits for _, splits in decode.graphs}) > 1
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    assert [out.token_ids for out in llm.generate(make_prompts(), params)] == expected
