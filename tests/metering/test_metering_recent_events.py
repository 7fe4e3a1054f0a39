"""An entry this process appended is exported from the event it kept, not decoded again; any
other entry is decoded as before; the events kept stay bounded. On a real Redis and store, and
through a served gateway with the official SDK."""

from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest
from gateway_runner import GatewayThread, RunningGateway, make_settings
from redis.asyncio import Redis
from usage_events import make_events

from gateway.ledger import EventQuery, UsageEvent, UsageStore
from gateway.ledger.dead_letters import DeadLetterQuery
from gateway.metering.buffer import UsageBuffer
from gateway.metering.exporter import UsageExporter
from gateway.metering.recent_events import RecentEvents
from gateway.metering.recorder import UsageRecorder
from gateway.store.scripts import ScriptBatch


def counting_decodes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The payloads decoded from JSON from now on."""
    decoded: list[bytes] = []
    real = UsageEvent.from_json.__func__  # type: ignore[attr-defined]

    def from_json(cls: type[UsageEvent], raw: bytes | str) -> UsageEvent:
        decoded.append(raw if isinstance(raw, bytes) else raw.encode())
        return real(cls, raw)

    monkeypatch.setattr(UsageEvent, "from_json", classmethod(from_json))
    return decoded


async def record(recorder: UsageRecorder, events: list[UsageEvent]) -> None:
    batch = ScriptBatch()
    for event in events:
        recorder.queue_record(batch, event)
    await batch.execute(recorder.buffer.redis)


def test_kept_events_are_bounded_oldest_first() -> None:
    events = make_events(5, seed=3)
    recent = RecentEvents(capacity=3)
    for event in events:
        recent.remember(event.to_json(), event)
    assert len(recent) == 3
    assert recent.take(events[0].to_json()) is None  # the two oldest went
    assert recent.take(events[4].to_json()) is events[4]
    assert recent.take(events[4].to_json()) is None  # taken once
    assert len(recent) == 2
    with pytest.raises(ValueError, match="capacity"):
        RecentEvents(capacity=0)


async def test_own_entries_are_exported_without_decoding(
    recorder: UsageRecorder,
    exporter: UsageExporter,
    usage_store: UsageStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert recorder.buffer is exporter.buffer  # as the app builds them
    events = make_events(40, seed=7)
    await record(recorder, events)
    assert len(recorder.buffer.recent) == 40
    decoded = counting_decodes(monkeypatch)
    assert await exporter.drain() == 40
    assert decoded == []
    assert len(recorder.buffer.recent) == 0
    stored = (await usage_store.list_events(EventQuery(limit=100))).events
    assert sorted(stored, key=lambda e: e.event_id) == sorted(events, key=lambda e: e.event_id)


async def test_another_replicas_entries_are_decoded(
    redis_client: Redis,
    usage_buffer: UsageBuffer,
    exporter: UsageExporter,
    usage_store: UsageStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    other = UsageBuffer(redis_client)  # another process's buffer of the same store
    other.bind(usage_store.store_id)
    events = make_events(12, seed=11)
    batch = ScriptBatch()
    for event in events:
        other.queue_append(batch, event.event_id, event.to_json(), event)
    await batch.execute(redis_client)
    decoded = counting_decodes(monkeypatch)
    assert await exporter.drain() == 12
    assert sorted(decoded) == sorted(event.to_json() for event in events)
    assert len(usage_buffer.recent) == 0 and len(other.recent) == 12
    assert len((await usage_store.list_events(EventQuery(limit=100))).events) == 12


async def test_an_own_event_past_the_stores_bounds_is_still_a_dead_letter(
    recorder: UsageRecorder, exporter: UsageExporter, usage_store: UsageStore
) -> None:
    now_ms = int(time.time() * 1000)
    fine = UsageEvent(event_id="req-fine", time_ms=now_ms, key_id="k1", model="m", provider="p")
    # A tab passes the event's own checks but not the store's (printable labels).
    tabbed = UsageEvent(
        event_id="req-tab", time_ms=now_ms, key_id="k1", model="m", provider="p", team="a\tb"
    )
    await record(recorder, [fine, tabbed])
    assert await exporter.drain() == 2
    assert [e.event_id for e in (await usage_store.list_events(EventQuery())).events] == [
        "req-fine"
    ]
    letters = (await usage_store.dead_letters(DeadLetterQuery())).letters
    assert [(letter.event_id, letter.field) for letter in letters] == [("req-tab", "team")]


def test_a_served_gateways_exporter_takes_its_own_events(
    tmp_path: Path, fake_policy: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with GatewayThread(make_settings(tmp_path, fake_policy, redis_url)) as gateway:
        served_and_exported(gateway, monkeypatch)


def served_and_exported(gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """Five answers through the SDK, exported, none of their events decoded from JSON."""
    key = gateway.create_key(name="recent")[1]
    services = gateway.services
    assert services.exporter.buffer is services.recorder.buffer  # as the app wires them
    decoded = counting_decodes(monkeypatch)
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=10)
    for turn in range(5):
        client.chat.completions.create(
            model="fake", messages=[{"role": "user", "content": f"hi {turn}"}], max_tokens=3
        )
    gateway.wait_exported()
    with gateway.admin() as admin:
        events = admin.get("/admin/usage/events", params={"limit": 10}).json()["data"]
    assert len(events) == 5
    assert decoded == [] and len(services.recorder.buffer.recent) == 0
