"""A stream recorded as it is relayed replays byte for byte, through real Redis, and the
usage-only chunk follows the replaying client's stream_options.include_usage."""

from __future__ import annotations

import orjson
import pytest

from gateway.cache import (
    CachedUsage,
    CacheEntry,
    CacheEntryError,
    CacheScope,
    ResponseCache,
    StreamRecorder,
)
from gateway.policy import CachePolicy

DONE = b"data: [DONE]\n\n"
SCOPE = CacheScope.of(model="fake-model", team="alpha", key_id="k1", shared=False)
POLICY = CachePolicy(ttl_s=60)


def upstream_chunks(words: list[str]) -> list[bytes]:
    """The data payloads an OpenAI-compatible upstream streams (usage last, as asked)."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    chunks += [{**base, "choices": [{"index": 0, "delta": {"content": w}}]} for w in words]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    usage = {"prompt_tokens": 5, "completion_tokens": len(words), "total_tokens": 5 + len(words)}
    chunks.append({**base, "choices": [], "usage": usage})
    return [orjson.dumps(chunk) for chunk in chunks] + [b"[DONE]"]


def relay(data: list[bytes], include_usage: bool, recorder: StreamRecorder) -> bytes:
    """What the gateway's relay sends a client, recording every frame on the way."""
    sent = []
    for payload in data:
        frame = DONE if payload == b"[DONE]" else b"data: " + payload + b"\n\n"
        usage_only = payload != b"[DONE]" and not orjson.loads(payload).get("choices")
        recorder.add(frame, optional=usage_only)
        if usage_only and not include_usage:
            continue
        sent.append(frame)
    return b"".join(sent)


@pytest.mark.parametrize("recorded_with_usage", [True, False])
async def test_a_stream_replays_byte_identical(
    cache: ResponseCache, recorded_with_usage: bool
) -> None:
    recorder = StreamRecorder(POLICY.max_entry_bytes)
    first_client = relay(
        upstream_chunks(["The", " answer", " is", " 4."]), recorded_with_usage, recorder
    )
    entry = recorder.finish(model="fake-model", provider="fake", usage=CachedUsage(5, 4))
    assert entry is not None
    looked = await cache.lookup(SCOPE, "k" * 64, POLICY)
    assert looked.entry is None
    assert await cache.store(SCOPE, "k" * 64, entry, POLICY, epoch=looked.epoch) == "stored"

    hit = (await cache.lookup(SCOPE, "k" * 64, POLICY)).entry
    assert hit is not None and hit.mode == "sse" and hit.usage == CachedUsage(5, 4, 0)
    assert hit.sse_body(include_usage=recorded_with_usage) == first_client
    other = hit.sse_body(include_usage=not recorded_with_usage)
    with_usage, without = (first_client, other) if recorded_with_usage else (other, first_client)
    frames_with = with_usage.split(b"\n\n")
    assert without.split(b"\n\n") == [f for f in frames_with if b'"usage"' not in f]
    assert b'"usage"' in with_usage and with_usage.endswith(DONE)
    assert (hit.model, hit.provider) == ("fake-model", "fake")


async def test_a_stream_that_outgrows_the_limit_is_not_kept(cache: ResponseCache) -> None:
    short, long = upstream_chunks(["word"] * 3), upstream_chunks(["word"] * 50)
    sizing = StreamRecorder(max_entry_bytes=1 << 20)
    relay(short, True, sizing)
    entry = sizing.finish(model="m", provider="p", usage=None)
    assert entry is not None
    exact = len(entry.encode())
    recorder = StreamRecorder(max_entry_bytes=exact)
    relay(short, True, recorder)
    kept = recorder.finish(model="m", provider="p", usage=None, created_ms=entry.created_ms)
    assert kept == entry
    assert (
        await cache.store(SCOPE, "e" * 64, kept, CachePolicy(max_entry_bytes=exact), epoch=0)
        == "stored"
    )
    tight = CachePolicy(max_entry_bytes=exact - 1)
    assert await cache.store(SCOPE, "t" * 64, kept, tight, epoch=0) == "too_large"
    recorder = StreamRecorder(max_entry_bytes=exact)
    relay(long, True, recorder)
    assert recorder.overflowed
    assert recorder.finish(model="m", provider="p", usage=None) is None


async def test_an_entry_larger_than_the_limit_is_skipped_and_counted(cache: ResponseCache) -> None:
    policy = CachePolicy(max_entry_bytes=1000)
    big = CacheEntry("json", "m", "p", created_ms=1, body=b"x" * 1000)
    assert await cache.store(SCOPE, "b" * 64, big, policy, epoch=0) == "too_large"
    small = CacheEntry("json", "m", "p", created_ms=1, body=b"x" * 100)
    assert await cache.store(SCOPE, "s" * 64, small, policy, epoch=0) == "stored"
    assert (await cache.lookup(SCOPE, "b" * 64, policy)).entry is None
    assert (await cache.lookup(SCOPE, "s" * 64, policy)).entry == small
    counters = (await cache.stats()).counters
    assert (counters["skip_too_large"], counters["store"]) == (1, 1)


def test_entries_round_trip_and_refuse_foreign_bytes() -> None:
    entry = CacheEntry(
        "sse",
        "m",
        "p",
        created_ms=1_700_000_000_123,
        body=b"ab" + b"cde",
        usage=CachedUsage(1, 2, 3),
        frames=(2, 3),
        optional=(1,),
    )
    assert CacheEntry.decode(entry.encode()) == entry
    assert entry.sse_body(include_usage=False) == b"ab"
    for foreign in (b"", b"SYC0" + entry.encode()[4:], entry.encode()[:-1], b"SYC1garbage"):
        with pytest.raises(CacheEntryError):
            CacheEntry.decode(foreign)
