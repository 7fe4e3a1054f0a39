"""The fleet as a provider, against loopback vLLM-like replicas: a replica that cannot take the
request (refused, dropped before answering, 503) is ejected and the request goes to the next,
once per replica; an answer of the request's own (400, 500) is not replayed; a stream fails
over only before its first event, and holds its replica until closed; a fleet whose replicas
are all busy spills, yet serves as the last resort; a policy edit retires the old fleet once
its requests end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import orjson
import pytest
from fleet_replica import EventRecorder, FakeReplica, body_homed_on, until
from ports import free_port

from gateway.errors import UpstreamError
from gateway.policy import ProviderConfig
from gateway.policy.store import PolicyStore
from gateway.providers.fleet.prefix import PrefixSettings, prefix_hashes
from gateway.providers.fleet_host import FleetHost
from gateway.providers.fleet_provider import FleetProvider
from gateway.settings import UpstreamSettings

UPSTREAM = UpstreamSettings(connect_timeout_s=1.0, read_timeout_s=10.0, total_timeout_s=30.0)
CHAT = "/chat/completions"
StartReplica = Callable[[str], Awaitable[FakeReplica]]
StartFleet = Callable[..., Awaitable[FleetProvider]]


def config(urls: list[str], **fleet: Any) -> ProviderConfig:
    block = {
        "replicas": urls,
        "scrape": {"interval_ms": 30, "timeout_s": 0.5},
        "probe_backoff_s": 0.2,
        **fleet,
    }
    return ProviderConfig.model_validate({"kind": "engine_fleet", "fleet": block})


@pytest.fixture
async def replica() -> AsyncIterator[StartReplica]:
    """Starts a loopback replica of the given name; each is stopped after the test."""
    async with AsyncExitStack() as started:

        async def start(name: str) -> FakeReplica:
            replica = await FakeReplica(name=name).start()
            started.push_async_callback(replica.stop)
            return replica

        yield start


@pytest.fixture
async def fleet(
    replica: StartReplica,  # so that the replicas stop after the fleets close
) -> AsyncIterator[StartFleet]:
    """Starts a fleet provider on ``settings`` (and an event log); each is closed after the
    test."""
    async with AsyncExitStack() as started:

        async def start(
            settings: ProviderConfig, log: EventRecorder | None = None
        ) -> FleetProvider:
            provider = FleetProvider("engines", settings, UPSTREAM, log or EventRecorder())
            await provider.start()
            started.push_async_callback(provider.close)
            return provider

        yield start


def state(provider: FleetProvider, url: str) -> str:
    return provider.fleet.members.replicas[url].health.describe()["state"]  # type: ignore[return-value]


def text_of(events: list[bytes]) -> str:
    pieces = []
    for data in events:
        if data != b"[DONE]":
            for choice in orjson.loads(data)["choices"]:
                pieces.append(choice["delta"].get("content") or "")
    return "".join(pieces)


async def test_a_refused_replica_is_ejected_and_the_request_served_by_the_next(
    replica: StartReplica, fleet: StartFleet
) -> None:
    live = await replica("b")
    dead = f"http://127.0.0.1:{free_port()}"
    provider = await fleet(config([dead, live.url]))
    body = body_homed_on(provider.fleet, dead)
    answer = await provider.post_json(CHAT, body)
    assert answer.data["choices"][0]["message"]["content"] == "served by b"
    assert answer.route_note == f"replica={live.label} (failover)"
    assert state(provider, dead) == "ejected"
    # The prefix now lives where it was served; another prefix homed on the ejected
    # replica goes straight to the live one.
    again = await provider.post_json(CHAT, body)
    assert again.route_note == f"replica={live.label} (affinity)"
    other = {**body_homed_on(provider.fleet, dead, start=500), "stream": True}
    stream = await provider.open_stream(CHAT, other)
    assert stream.route_note == f"replica={live.label} (ejected-skip)"
    assert text_of([data async for batch in stream.batches() for data in batch]) == "served by b"


async def test_a_503_fails_over_and_ejects_but_the_requests_own_errors_are_not_replayed(
    replica: StartReplica, fleet: StartFleet
) -> None:
    a, b = await replica("a"), await replica("b")
    provider = await fleet(config([a.url, b.url], eject_after=100))
    body = body_homed_on(provider.fleet, a.url)
    a.chat_status = 503  # draining, or overloaded
    answer = await provider.post_json(CHAT, body)
    assert answer.data["choices"][0]["message"]["content"] == "served by b"
    assert state(provider, a.url) == "ejected"
    await until(lambda: state(provider, a.url) == "healthy")  # its scrape answers

    body = body_homed_on(provider.fleet, a.url, start=500)  # a prefix a has not lost
    for status, client_sees in ((500, 502), (400, 400)):
        a.chat_status = status
        served_before = b.served
        with pytest.raises(UpstreamError) as raised:
            await provider.post_json(CHAT, body)
        assert raised.value.status == client_sees
        assert b.served == served_before and state(provider, a.url) == "healthy"


async def test_a_stream_fails_over_only_while_nothing_was_streamed(
    replica: StartReplica, fleet: StartFleet
) -> None:
    a, b = await replica("a"), await replica("b")
    provider = await fleet(config([a.url, b.url], eject_after=100))
    body = {**body_homed_on(provider.fleet, a.url), "stream": True}
    a.hold_s = 30.0  # headers sent, no event yet: then the replica dies
    opening = asyncio.create_task(provider.open_stream(CHAT, body))
    await until(lambda: a.inflight == 1)
    await a.stop()
    stream = await opening
    assert stream.route_note == f"replica={b.label} (failover)"
    assert text_of([data async for batch in stream.batches() for data in batch]) == "served by b"
    assert state(provider, a.url) == "ejected"

    await a.start()  # back on its port: probed, readmitted, and home again
    a.hold_s, a.stall_s = 0.0, 30.0  # this time the first event goes out, then it dies
    await until(lambda: state(provider, a.url) == "healthy")
    body = {**body_homed_on(provider.fleet, a.url, start=500), "stream": True}
    stream = await provider.open_stream(CHAT, body)
    assert stream.route_note == f"replica={a.label} (affinity)"
    batches = stream.batches()
    assert text_of(await anext(batches)) == "served"
    await a.stop()
    with pytest.raises(UpstreamError) as raised:
        await anext(batches)
    assert raised.value.kind == "protocol"  # too late to fail over: the client has bytes
    stream.close()


async def test_a_stream_holds_its_replica_until_it_is_closed(
    replica: StartReplica, fleet: StartFleet
) -> None:
    a = await replica("a")
    provider = await fleet(config([a.url]))
    member = provider.fleet.members.replicas[a.url]
    stream = await provider.open_stream(CHAT, {"model": "tiny", "stream": True})
    assert member.inflight == 1
    assert [data async for batch in stream.batches() for data in batch][-1] == b"[DONE]"
    assert member.inflight == 0
    stream = await provider.open_stream(CHAT, {"model": "tiny", "stream": True})
    stream.close()  # the client went away mid-stream
    stream.close()
    assert member.inflight == 0
    await provider.post_json(CHAT, {"model": "tiny"})
    assert member.inflight == 0 and member.served == 3


async def test_a_fleet_past_spill_when_spills_yet_serves_as_the_last_resort(
    replica: StartReplica, fleet: StartFleet
) -> None:
    a, b = await replica("a"), await replica("b")
    provider = await fleet(
        ProviderConfig.model_validate(
            {**config([a.url, b.url]).model_dump(), "spill_when": {"kv_usage": 0.9}}
        )
    )
    loads = provider.fleet.members.replicas
    a.kv_usage = b.kv_usage = 0.95
    await until(lambda: all(r.load and r.load.kv_usage == 0.95 for r in loads.values()))
    out = provider.unavailable()
    assert out is not None and out.spill and "spill_when" in out.detail
    answer = await provider.post_json(CHAT, {"model": "tiny"})  # tried last: it queues
    assert answer.data["choices"][0]["message"]["content"].startswith("served by")


async def test_with_no_replica_left_the_last_error_is_raised_then_a_503(fleet: StartFleet) -> None:
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    provider = await fleet(config(dead, probe_backoff_s=30, probe_backoff_max_s=30))
    with pytest.raises(UpstreamError) as raised:
        await provider.post_json(CHAT, {"model": "tiny"})
    assert raised.value.kind == "connect" and raised.value.retryable
    assert all(state(provider, url) == "ejected" for url in dead)
    out = provider.unavailable()
    assert out is not None and not out.spill and "ejected" in out.detail
    with pytest.raises(UpstreamError) as raised:
        await provider.post_json(CHAT, {"model": "tiny"})
    assert (raised.value.status, raised.value.code) == (503, "no_replica_available")
    assert "127.0.0.1" not in raised.value.message  # replica addresses stay internal


def policy_with(provider: ProviderConfig | None) -> str:
    """A policy file's text (JSON, which is YAML) with ``provider`` as ``engines``."""
    providers: dict[str, Any] = {"up": {"base_url": "http://127.0.0.1:9/v1"}}
    if provider is not None:
        providers["engines"] = provider.model_dump(mode="json", exclude_none=True)
    return orjson.dumps({"providers": providers, "models": {"m": {"provider": "up"}}}).decode()


async def test_a_policy_edit_retires_the_old_fleet_once_its_requests_end(
    replica: StartReplica, tmp_path: Path
) -> None:
    a = await replica("a")
    host = FleetHost(UPSTREAM, None, EventRecorder(), watch_interval_s=0.02)
    policies = PolicyStore(tmp_path / "routing_rules.yaml")
    policies.write(policy_with(config([a.url])))
    await host.start(policies)
    try:
        old = host.provider("engines")
        assert old is not None and old.started
        stream = await old.open_stream(CHAT, {"model": "tiny", "stream": True})

        policies.write(policy_with(config([a.url], routing="round_robin")))
        await until(lambda: host.provider("engines") is not old)
        new = host.provider("engines")
        assert new is not None
        await until(lambda: new.started)  # started by the watch, before any request
        assert not old._closed  # a stream is still flowing on the old one
        assert [data async for batch in stream.batches() for data in batch][-1] == b"[DONE]"
        await until(lambda: old._closed)

        policies.write(policy_with(None))  # the fleet leaves the policy
        await until(lambda: host.provider("engines") is None and new._closed)
    finally:
        await host.stop()


async def test_prefix_blocks_follow_the_replicas_tokenizer_when_it_is_given(
    fleet: StartFleet, checkpoint: Path, tokenizer: Any
) -> None:
    prefix = {"tokenizer": str(checkpoint / "tokenizer.json"), "blocks": 2, "block_tokens": 8}
    provider = await fleet(config(["http://127.0.0.1:9"], prefix=prefix))
    log = EventRecorder()
    missing = await fleet(
        config(["http://127.0.0.1:9"], prefix={**prefix, "tokenizer": "/nonexistent.json"}), log
    )
    assert (provider.prefix_units, missing.prefix_units) == ("tokens", "chars")
    assert log.named("fleet_tokenizer_unavailable")[0]["using"] == "characters"
    body = {"model": "tiny", "prompt": "The quick brown fox jumps over the lazy dog " * 4}
    ids = tokenizer.encode("The quick brown fox jumps over the lazy dog " * 4, False)
    expected = prefix_hashes(body, PrefixSettings(2, 256, 8), lambda _text: ids)
    assert provider.fleet.prefix_hashes(body) == expected
    assert missing.fleet.prefix_hashes(body) != expected
