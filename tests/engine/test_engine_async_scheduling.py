"""Asynchronous scheduling on the CPU: step N+1 is launched before step N's tokens are read
back (its decode inputs filled on the device from step N's samples), and every output is
the same as the synchronous loop's, token for token."""

from __future__ import annotations

import asyncio

import pytest
from engine_helpers import MAX_NEW_TOKENS, assert_all_blocks_free, make_llm

from engine.config import EngineConfig
from engine.core.async_engine import AsyncEngine
from engine.errors import ConfigError
from engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)


def _count_device_fed_steps(llm, monkeypatch) -> list[int]:
    """Spy: how many decode inputs each launch took from the previous step's samples."""
    runner = llm.engine.runner
    fed: list[int] = []
    real_launch = runner.launch

    def launch(inputs):
        fed.append(len(inputs.prev_token_positions))
        return real_launch(inputs)

    monkeypatch.setattr(runner, "launch", launch)
    return fed


def test_async_scheduling_matches_hf_under_chunking_and_preemption(
    checkpoints, hf_reference, monkeypatch
):
    prompts, expected = hf_reference("llama")
    longest = max(len(p) for p in prompts) + MAX_NEW_TOKENS
    llm = make_llm(
        checkpoints("llama"),
        async_scheduling=True,
        num_gpu_blocks=-(-longest // 16) + 2,
        max_num_batched_tokens=32,
        enable_prefix_caching=True,
    )
    assert llm.engine.async_scheduling
    fed = _count_device_fed_steps(llm, monkeypatch)
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == expected
    snap = llm.engine.stats.snapshot()
    assert snap["num_preemptions"] > 0
    # most decode inputs came from the device: the host had not seen them yet
    assert sum(fed) > len(prompts) * MAX_NEW_TOKENS // 2
    assert_all_blocks_free(llm)


def _feature_requests(base_text: str, base_ids: list[int]) -> list[tuple[str, SamplingParams]]:
    stop = base_text[4:7]
    return [
        ("the quick brown fox", SamplingParams(temperature=1.0, top_p=0.9, seed=11, max_tokens=20)),
        (
            "a gateway sends each request",
            SamplingParams(temperature=0.8, top_k=20, seed=5, presence_penalty=1.5, max_tokens=20),
        ),
        (
            "numbers: 1 2 3",
            SamplingParams(temperature=0.0, frequency_penalty=2.0, max_tokens=24, logprobs=3),
        ),
        ("café 🙂", SamplingParams(temperature=0.0, max_tokens=24, stop=[stop])),
        (
            "café 🙂",
            SamplingParams(
                temperature=0.0, max_tokens=24, stop=[stop], include_stop_str_in_output=True
            ),
        ),
        ("numbers: 1 2 3", SamplingParams(temperature=0.0, max_tokens=24, repetition_penalty=1.5)),
        (
            "the lazy dog",
            SamplingParams(temperature=0.9, seed=8, max_tokens=20, repetition_penalty=0.8),
        ),
        (
            "café 🙂",
            SamplingParams(
                temperature=0.0, max_tokens=16, stop_token_ids=[base_ids[3]], min_tokens=2
            ),
        ),
        ("the lazy dog", SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=12, min_p=0.1)),
        ("hello", SamplingParams(temperature=0.0, max_tokens=3)),
    ]


def _summary(outputs) -> list:
    return [
        [
            (
                c.index,
                c.text,
                c.token_ids,
                c.finish_reason,
                None if c.logprobs is None else [(e.token_id, sorted(e.top)) for e in c.logprobs],
            )
            for c in out.outputs
        ]
        for out in outputs
    ]


def test_async_scheduling_matches_sync_for_every_sampling_feature(llama_path, monkeypatch):
    sync = make_llm(llama_path)
    base = sync.generate(["café 🙂"], SamplingParams(temperature=0.0, max_tokens=24))[0]
    requests = _feature_requests(base.text, base.token_ids)
    prompts = [prompt for prompt, _ in requests]
    params = [p for _, p in requests]
    expected = sync.generate(prompts, params)
    assert expected[3].finish_reason == "stop" and expected[7].finish_reason == "stop"
    assert expected[4].outputs[0].text == expected[3].outputs[0].text + base.text[4:7]
    assert len(expected[8].outputs) == 3

    late = make_llm(llama_path, async_scheduling=True)
    fed = _count_device_fed_steps(late, monkeypatch)
    assert _summary(late.generate(prompts, params)) == _summary(expected)
    assert any(fed)
    # the same engine again: rows, generators and penalty counts were handed back cleanly
    assert _summary(late.generate(prompts, params)) == _summary(expected)
    assert_all_blocks_free(late)


async def _stream(engine: AsyncEngine, request_id: str, prompt: str, params: SamplingParams):
    texts: dict[int, list[str]] = {}
    ids: dict[int, list[int]] = {}
    finish: dict[int, str] = {}
    async for out in engine.generate(request_id, prompt, params):
        texts.setdefault(out.index, []).append(out.text)
        ids.setdefault(out.index, []).extend(out.token_ids)
        assert out.num_output_tokens == len(ids[out.index])
        if out.finish_reason:
            finish[out.index] = out.finish_reason
    return [("".join(texts[i]), ids[i], finish.get(i)) for i in sorted(ids)]


async def test_async_engine_streams_the_same_with_async_scheduling(llama_path):
    sync = make_llm(llama_path)
    base = sync.generate(["café 🙂"], SamplingParams(temperature=0.0, max_tokens=24))[0]
    requests = _feature_requests(base.text, base.token_ids)
    expected = [
        [(c.text, c.token_ids, c.finish_reason) for c in out.outputs]
        for out in sync.generate([p for p, _ in requests], [p for _, p in requests])
    ]
    engine = AsyncEngine(EngineConfig(model=str(llama_path), device="cpu", async_scheduling=True))
    engine.start()
    try:
        got = await asyncio.gather(
            *(_stream(engine, f"r{i}", prompt, p) for i, (prompt, p) in enumerate(requests))
        )
        for _ in range(200):  # a stop string's finish reaches the engine thread in a step
            if not engine.engine.has_unfinished_requests():
                break
            await asyncio.sleep(0.01)
        assert_all_blocks_free(engine.engine)
    finally:
        engine.shutdown()
    assert [[tuple(x) for x in out] for out in got] == expected


def test_async_scheduling_is_refused_with_tensor_parallelism():
    with pytest.raises(ConfigError, match="async_scheduling"):
        EngineConfig(model="x", async_scheduling=True, tensor_parallel_size=2)


def test_async_scheduling_decodes_every_sequence_every_step(llama_path, monkeypatch):
    """A token in flight does not cost its sequence a step: each step launches the next
    while the previous is read back, with no empty step in between to drain it."""
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    prompts = [f"prompt number {i} " * (i + 1) for i in range(6)]
    llm = make_llm(llama_path, async_scheduling=True)
    calls = []
    real_step_core = llm.engine.step_core

    def step_core():
        calls.append("step")
        return real_step_core()

    monkeypatch.setattr(llm.engine, "step_core", step_core)
    llm.generate(prompts, params)
    history = llm.engine.stats.step_history()
    assert all(s.num_decode_seqs == 6 for s in history if not s.num_prefill_seqs)
    # one call per launched step, plus the last one that only reads back
    assert len(calls) == len(history) + 1 == 20 + 1
