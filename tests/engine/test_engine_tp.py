"""Tensor parallelism on the CPU (gloo): same tokens as one rank, sharded loading, dead ranks.

Two ranks are two spawned worker processes; each test keeps prompts and tokens few so the
whole file stays well under a minute on two cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from engine_helpers import INIT_STD, assert_all_blocks_free, make_llm, make_prompts
from tiny_checkpoint import write_tiny_checkpoint

from engine.config import EngineConfig
from engine.core.async_engine import AsyncEngine
from engine.errors import ConfigError, EngineDeadError, LoaderError
from engine.loader import SafetensorsSlice, build_model, load_model_args
from engine.models.llama import ParallelSpec
from engine.sampling import SamplingParams
from engine.tokenizer import Tokenizer

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def _generate_all(llm, prompts):
    """Greedy prompts, a seeded sample and an n=2 request (copy-on-write) in one batch."""
    params = [GREEDY] * len(prompts)
    params.append(SamplingParams(temperature=0.8, seed=7, max_tokens=12, ignore_eos=True))
    params.append(SamplingParams(temperature=0.0, n=2, max_tokens=8, ignore_eos=True))
    outs = llm.generate([*prompts, prompts[0], prompts[1]], params)
    return [[c.token_ids for c in out.outputs] for out in outs]


def _compare_tp(path: Path, prompts: list[list[int]], **settings: object) -> list[int]:
    """Runs tp=1 then tp=2 on the same work; returns each rank's weight bytes for tp=2."""
    single = make_llm(path, **settings)
    expected = _generate_all(single, prompts)
    full_bytes = single.engine.runner.weight_bytes
    sharded = make_llm(path, tensor_parallel_size=2, **settings)
    try:
        got = _generate_all(sharded, prompts)
        per_rank = sharded.engine.runner.weight_bytes_per_rank
        assert sharded.engine.healthy
        assert_all_blocks_free(sharded)
    finally:
        sharded.shutdown()
    assert got == expected
    assert all(len(out[0]) == 16 for out in got[: len(prompts)])
    # each rank holds about half the weights (norms are replicated, the rest is split)
    assert len(per_rank) == 2 and all(b < 0.6 * full_bytes for b in per_rank)
    return per_rank


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_two_ranks_match_one_rank(checkpoints, arch):
    path = checkpoints(arch)  # 4 heads, 2 KV heads: one KV head per rank
    prompts = make_prompts(Tokenizer(path), count=6)
    # a small token budget chunks the long prompts over several steps, prefix cache on
    _compare_tp(path, prompts, max_num_batched_tokens=40, max_model_len=256)


def test_two_ranks_share_a_single_kv_head(tmp_path):
    """GQA with more ranks than KV heads: both ranks hold (replicate) the one KV head."""
    path = write_tiny_checkpoint(
        tmp_path / "gqa", arch="llama", seed=3, init_std=INIT_STD, num_key_value_heads=1
    )
    prompts = make_prompts(Tokenizer(path), count=4)
    _compare_tp(path, prompts, max_model_len=256)


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_each_rank_reads_only_its_slices(tmp_path, kv_heads, monkeypatch):
    path = write_tiny_checkpoint(
        tmp_path / "ckpt", arch="qwen2", seed=5, num_key_value_heads=kv_heads, shards=2
    )
    args = load_model_args(path)
    whole_reads: list[tuple[int, ...]] = []
    real_full = SafetensorsSlice.full

    def spy_full(self):
        whole_reads.append(self.shape)
        return real_full(self)

    def build(tp_size: int, rank: int):
        return build_model(
            path, args, torch.device("cpu"), torch.float32, "torch", False,
            ParallelSpec(tp_size, rank),
        )  # fmt: skip

    full = build(1, 0).state_dict()
    monkeypatch.setattr(SafetensorsSlice, "full", spy_full)
    ranks = [build(2, rank).state_dict() for rank in range(2)]
    # only the norms (1-D) are read whole; every matrix and bias is read as a slice
    assert whole_reads and all(len(shape) == 1 for shape in whole_reads)
    d = args.head_dim
    q_rows, kv_rows = args.num_heads // 2 * d, max(1, kv_heads // 2) * d
    for layer in range(args.num_layers):
        p = f"model.layers.{layer}."
        qkv = [r[p + "self_attn.qkv_proj.weight"] for r in ranks]
        whole = full[p + "self_attn.qkv_proj.weight"]
        q_full, k_full = whole[: 2 * q_rows], whole[2 * q_rows : 2 * q_rows + kv_heads * d]
        assert torch.equal(torch.cat([t[:q_rows] for t in qkv]), q_full)
        ks = [t[q_rows : q_rows + kv_rows] for t in qkv]
        if kv_heads == 1:  # replicated: both ranks hold the single head
            assert torch.equal(ks[0], k_full) and torch.equal(ks[1], k_full)
        else:
            assert torch.equal(torch.cat(ks), k_full)
        o = [r[p + "self_attn.o_proj.weight"] for r in ranks]
        assert torch.equal(torch.cat(o, dim=1), full[p + "self_attn.o_proj.weight"])
        down = [r[p + "mlp.down_proj.weight"] for r in ranks]
        assert torch.equal(torch.cat(down, dim=1), full[p + "mlp.down_proj.weight"])
    embed = torch.cat([r["model.embed_tokens.weight"] for r in ranks])
    assert torch.equal(embed[: args.vocab_size], full["model.embed_tokens.weight"])


def test_tensor_parallel_settings_are_validated(llama_path):
    with pytest.raises(ConfigError, match="tensor_parallel_size must be an integer >= 1"):
        EngineConfig(tensor_parallel_size=0)
    with pytest.raises(ConfigError, match="num_attention_heads"):
        make_llm(llama_path, tensor_parallel_size=3)  # 4 heads: refused before any spawn
    config = EngineConfig(tensor_parallel_size=3)
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        config.validate_tensor_parallel(6, 2, 6, torch.device("cpu"))
    too_many = (os.cpu_count() or 1) + 1
    with pytest.raises(ConfigError, match="CPU cores available"):
        EngineConfig(tensor_parallel_size=too_many).validate_tensor_parallel(
            too_many, 1, too_many, torch.device("cpu")
        )


def test_bad_checkpoint_under_two_ranks_raises_the_loader_error(llama_path, tmp_path):
    path = tmp_path / "bad"
    shutil.copytree(llama_path, path)
    config = json.loads((path / "config.json").read_text())
    config["intermediate_size"] *= 2  # the MLP weights no longer fit
    (path / "config.json").write_text(json.dumps(config))
    began = time.monotonic()
    with pytest.raises(LoaderError, match=r"mlp.*expected"):
        make_llm(path, tensor_parallel_size=2)
    assert time.monotonic() - began < 30


async def test_killed_rank_fails_requests_fast_and_marks_engine_unhealthy(llama_path):
    engine = AsyncEngine(EngineConfig(model=str(llama_path), device="cpu", tensor_parallel_size=2))
    engine.start()
    pids = engine.engine.runner.worker_pids
    try:
        assert engine.healthy
        params = SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True)
        started = asyncio.Event()

        async def consume(request_id: str) -> int:
            count = 0
            async for out in engine.generate(request_id, "the quick brown fox", params):
                count += len(out.token_ids)
                started.set()
            return count

        tasks = [asyncio.create_task(consume(f"r{i}")) for i in range(2)]
        await asyncio.wait_for(started.wait(), 30)
        os.kill(pids[1], signal.SIGKILL)
        killed_at = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=15)
        elapsed = time.monotonic() - killed_at
        assert all(isinstance(r, EngineDeadError) for r in results), results
        assert "rank 1" in str(results[0]) and "signal 9" in str(results[0])
        assert elapsed < 5.0
        assert not engine.healthy
        assert "rank 1" in (engine.dead_reason or "")
        with pytest.raises(EngineDeadError, match="dead"):
            async for _ in engine.generate("late", "hello", params):
                pass
        assert_all_blocks_free(engine.engine)
    finally:
        began = time.monotonic()
        engine.shutdown()
        assert time.monotonic() - began < 10.0
    for pid in pids:  # every rank is gone (and reaped)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_rank_dying_while_idle_is_noticed_without_a_request(llama_path):
    llm = make_llm(llama_path, tensor_parallel_size=2, max_model_len=256)
    try:
        assert llm.generate(["hello"], GREEDY)[0].token_ids
        os.kill(llm.engine.runner.worker_pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 5
        while llm.engine.healthy and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not llm.engine.healthy
        began = time.monotonic()
        with pytest.raises(EngineDeadError, match=r"rank 0 .* killed by signal 9"):
            llm.generate(["hello again"], GREEDY)
        assert time.monotonic() - began < 5.0
        assert_all_blocks_free(llm)
    finally:
        llm.shutdown()
