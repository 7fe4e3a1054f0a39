"""The CPU's float linear layers through oneDNN with packed weights or `F.linear`: the same
products up to float rounding, dense copies freed unless shared, HF's tokens either way, and
the load-time choice between them (`linear_kernel: auto`) timed once and cached."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from engine_helpers import MAX_NEW_TOKENS, make_llm

from engine.layers import cpu_matmul
from engine.layers.kernel_choice import FLinear, OneDnnLinear
from engine.layers.linear import ParallelLMHead, RowParallelLinear
from engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN"
)


@pytest.mark.parametrize("rows", [1, 16, 300])
def test_packed_product_equals_f_linear_up_to_rounding(rows):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 40, generator=generator)
    bias = torch.randn(96, generator=generator)
    x = torch.randn(2, rows, 40, generator=generator)  # any leading shape
    packed = cpu_matmul.pack(weight)
    assert packed is not None
    got = cpu_matmul.packed_linear(x, packed, bias)
    torch.testing.assert_close(got, F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)


def test_only_float32_cpu_weights_are_packed():
    assert cpu_matmul.pack(torch.randn(8, 8, dtype=torch.float64)) is None
    assert cpu_matmul.pack(torch.randn(8, 8, dtype=torch.bfloat16)) is None
    assert cpu_matmul.pack(torch.randn(8)) is None


def test_runner_packs_and_frees_only_unshared_weights(llama_path):
    runner = make_llm(llama_path, linear_kernel="onednn").engine.runner
    assert runner.packed_bytes > 0
    model = runner.model
    down = model.model.layers[0].mlp.down_proj
    assert isinstance(down, RowParallelLinear) and isinstance(down.method, OneDnnLinear)
    assert down.weight.numel() == 0  # only the packed copy is read
    head = model.lm_head
    assert isinstance(head, ParallelLMHead)
    if model.args.tie_word_embeddings:  # the embedding looks rows up: no second, packed copy
        assert head.weight is model.model.embed_tokens.weight and head.weight.numel() > 0
        assert isinstance(head.method, FLinear)
    else:
        assert isinstance(head.method, OneDnnLinear)
    dense = sum(
        p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values()
    )
    assert runner.weight_bytes == dense + runner.packed_bytes


def test_same_tokens_as_hf_packed_or_not(checkpoints, hf_reference, monkeypatch):
    prompts, expected = hf_reference("qwen3")
    packed = make_llm(checkpoints("qwen3"), linear_kernel="onednn")
    assert packed.engine.runner.packed_bytes > 0
    assert [o.token_ids for o in packed.generate(prompts, GREEDY)] == expected
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    plain = make_llm(checkpoints("qwen3"))
    assert plain.engine.runner.packed_bytes == 0
    methods = [m.method for m in plain.engine.runner.model.modules() if hasattr(m, "method")]
    assert methods and all(isinstance(m, FLinear) for m in methods)
    assert [o.token_ids for o in plain.generate(prompts, GREEDY)] == expected


def test_auto_times_the_candidates_once_and_reuses_the_choice(llama_path, tmp_path, caplog):
    caplog.set_level("INFO", logger="engine.layers.kernel_choice")
    first = make_llm(llama_path, kernel_cache_dir=str(tmp_path)).engine.runner
    assert "timed" in caplog.text
    (cache_file,) = tmp_path.glob("linear-choice-*.json")
    choices = json.loads(cache_file.read_text())
    assert choices and all(c in (["f_linear"], ["onednn"]) for c in choices.values())
    caplog.clear()
    second = make_llm(llama_path, kernel_cache_dir=str(tmp_path)).engine.runner
    assert "timed" not in caplog.text and "->" in caplog.text  # read back, still logged
    kinds = [
        [type(m.method) for m in runner.model.modules() if hasattr(m, "method")]
        for runner in (first, second)
    ]
    assert kinds[0] == kinds[1]
