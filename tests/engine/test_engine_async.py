"""AsyncEngine: concurrent streams batch together; cancelling a stream frees its blocks."""

from __future__ import annotations

import asyncio

import pytest
from engine_helpers import assert_all_blocks_free

from engine.config import EngineConfig
from engine.core.async_engine import AsyncEngine
from engine.errors import EngineNotRunningError, RequestTooLargeError
from engine.sampling import SamplingParams
from engine.tokenizer import REPLACEMENT_CHAR


@pytest.fixture
def async_engine(llama_path):
    engine = AsyncEngine(EngineConfig(model=str(llama_path), device="cpu", max_model_len=512))
    engine.start()
    yield engine
    engine.shutdown()


async def _collect(engine: AsyncEngine, request_id: str, prompt: str, params: SamplingParams):
    pieces, token_ids, finish = [], [], None
    async for out in engine.generate(request_id, prompt, params):
        pieces.append(out.text)
        token_ids.extend(out.token_ids)
        assert out.num_output_tokens == len(token_ids)
        if out.finish_reason:
            finish = out.finish_reason
            assert out.finished
    return "".join(pieces), token_ids, finish


async def test_eight_concurrent_streams_interleave(async_engine):
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [f"request {i}: the quick brown fox " + "jumps " * i for i in range(8)]
    results = await asyncio.gather(
        *(_collect(async_engine, f"s{i}", p, params) for i, p in enumerate(prompts))
    )
    assert all(finish == "length" and len(ids) == 24 for _, ids, finish in results)
    steps = async_engine.engine.stats.step_history()
    # continuous batching: many steps decoded several requests at once
    assert max(s.num_decode_seqs for s in steps) >= 4
    assert len(steps) < 8 * 24
    # the streamed text equals what the offline detokenizer makes of the same tokens
    tok = async_engine.engine.tokenizer
    for text, ids, _ in results:
        assert text == tok.decode(ids)
    snap = async_engine.stats()
    assert snap["time_to_first_token_seconds"]["count"] >= 8
    assert snap["inter_token_latency_seconds"]["count"] > 0
    assert snap["generation_tokens_total"] >= 8 * 24
    assert_all_blocks_free(async_engine.engine)


async def test_cancelled_stream_frees_its_blocks(async_engine):
    params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
    got_tokens = asyncio.Event()

    async def consume(request_id: str) -> None:
        async for out in async_engine.generate(request_id, "the quick brown fox", params):
            if out.token_ids:
                got_tokens.set()

    keep = asyncio.create_task(
        _collect(async_engine, "keep", "a gateway", SamplingParams(max_tokens=30, ignore_eos=True))
    )
    task = asyncio.create_task(consume("doomed"))
    await asyncio.wait_for(got_tokens.wait(), 30)
    assert async_engine.engine.block_manager.num_used_blocks > 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    _, ids, finish = await asyncio.wait_for(keep, 60)
    assert finish == "length" and len(ids) == 30
    for _ in range(200):  # the abort reaches the engine thread within a step or two
        if not async_engine.engine.requests:
            break
        await asyncio.sleep(0.01)
    assert_all_blocks_free(async_engine.engine)
    assert async_engine.load()["num_requests_running"] == 0


async def test_abort_returns_after_blocks_are_freed(async_engine):
    params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
    stream = async_engine.generate("to-abort", "the lazy dog", params)
    first = await stream.__anext__()
    assert first.request_id == "to-abort"
    assert await async_engine.abort("to-abort") is True
    assert_all_blocks_free(async_engine.engine)
    await stream.aclose()
    assert await async_engine.abort("unknown") is False


async def test_request_that_can_never_fit_is_refused(async_engine):
    with pytest.raises(RequestTooLargeError, match="max_model_len"):
        async for _ in async_engine.generate("big", "hello", SamplingParams(max_tokens=10_000)):
            pass
    load = async_engine.load()
    assert set(load) == {"num_requests_waiting", "num_requests_running", "kv_cache_usage_perc"}


async def test_multibyte_text_streams_whole_characters(async_engine):
    tok = async_engine.engine.tokenizer
    # force emoji and accented text out byte by byte: the prompt's own tokens, replayed
    text = "café 🙂 日本語"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > len(text) // 2  # several characters span more than one token
    from engine.tokenizer import IncrementalDetokenizer

    detok = IncrementalDetokenizer(tok, tok.encode("hello", add_special_tokens=True))
    pieces = [detok.push(t) for t in ids]
    assert all(REPLACEMENT_CHAR not in p for p in pieces)
    assert "".join(pieces) == text


async def test_stop_string_never_reaches_the_stream(async_engine):
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    full, _, _ = await _collect(async_engine, "full", "the quick brown fox", greedy)
    assert len(full) > 8
    stop = full[5:8]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[stop])
    pieces = []
    async for out in async_engine.generate("cut", "the quick brown fox", params):
        pieces.append(out.text)
    assert "".join(pieces) == full[: full.index(stop)]
    assert out.finish_reason == "stop"
    assert all(stop not in piece for piece in pieces)


async def test_generate_after_shutdown_is_refused(llama_path):
    engine = AsyncEngine(EngineConfig(model=str(llama_path), device="cpu"))
    engine.start()
    params = SamplingParams(max_tokens=300, ignore_eos=True)
    stream = engine.generate("long", "hello", params)
    await stream.__anext__()
    engine.shutdown()
    with pytest.raises(EngineNotRunningError):
        async for _ in stream:
            pass
    with pytest.raises(EngineNotRunningError, match="start"):
        async for _ in engine.generate("late", "hello", params):
            pass
    assert_all_blocks_free(engine.engine)
