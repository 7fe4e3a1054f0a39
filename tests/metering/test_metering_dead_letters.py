"""The exporter never deletes an event it could not store (issue 26): between a real Redis and
real stores (SQLite and PostgreSQL), an event the ledger refuses (a team with a tab, written
by a key made before the entry points checked labels) and an event the database refuses (a
trigger that refuses one event id) are kept as dead letters, with an error line and the
metrics; the rest of their batch is stored; a replay before the cause is fixed keeps them, and
a replay after it (the label corrected, the trigger dropped) stores them exactly once."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis
from usage_events import make_events

from gateway.ledger import EventQuery, RollupQuery, UsageEvent, UsageStore, open_store
from gateway.ledger.dead_letters import DeadLetterQuery
from gateway.metering.buffer import FIELD, UsageBuffer
from gateway.metering.dead_letters import DeadLetters
from gateway.metering.exporter import UsageExporter
from gateway.metrics import Metrics
from gateway.settings import ExportSettings
from gateway.store.scripts import ScriptBatch


class RecordingLog:
    """The exporter's logger, keeping each line as (level, event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.lines.append((level, event, fields))


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'usage.sqlite3'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
async def store(store_url: str, tmp_path: Path) -> Any:
    opened = await open_store(store_url, data_dir=tmp_path)
    opened.test_url = store_url  # type: ignore[attr-defined]
    yield opened
    await opened.close()


async def _record(buffer: UsageBuffer, payloads: list[tuple[str, bytes]]) -> None:
    batch = ScriptBatch()
    for event_id, payload in payloads:
        buffer.queue_append(batch, event_id, payload)
    await batch.execute(buffer.redis)


def _gauge(metrics: Metrics, name: str, outcome: str | None = None) -> float:
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("outcome") == outcome:
                return sample.value
    raise AssertionError(f"no sample {name} {outcome}")


async def _stored_ids(store: UsageStore) -> set[str]:
    return {e.event_id for e in (await store.list_events(EventQuery(limit=1000))).events}


async def _setup(
    redis: Redis, store: UsageStore
) -> tuple[UsageBuffer, UsageExporter, RecordingLog]:
    await redis.flushall()
    buffer = UsageBuffer(redis)
    buffer.bind(store.store_id)
    log = RecordingLog()
    return buffer, UsageExporter(buffer, store, ExportSettings(), Metrics(), log), log


async def test_an_event_the_ledger_refuses_is_kept_listed_and_replayed_once_corrected(
    redis_client: Redis, store: UsageStore
) -> None:
    buffer, exporter, log = await _setup(redis_client, store)
    good = make_events(30, seed=61, days=1)
    # What a key made on main with team "tab\there" recorded: served and billed upstream.
    bad = UsageEvent.from_dict({**good[0].to_dict(), "request_id": "tabbed", "team": "tab\there"})
    await _record(buffer, [(e.event_id, e.to_json()) for e in [*good[:15], bad, *good[15:]]])
    # Bytes no version can read are kept too, not dropped.
    await redis_client.xadd(buffer.keys[2], {FIELD: b'{"not": "an event"}'})

    assert await exporter.drain() == 32
    assert await _stored_ids(store) == {e.event_id for e in good}  # the batch went on
    assert (await buffer.stats()).backlog == 0  # Redis holds nothing of them
    letters = DeadLetters(store)
    page = await letters.page()
    assert page["total"] == 2
    first = await letters.page(limit=1)
    second = await letters.page(limit=1, cursor=first["next_cursor"])
    assert [*first["data"], *second["data"]] == page["data"] and second["next_cursor"] is None
    tabbed = next(item for item in page["data"] if item["event_id"] == "tabbed")
    assert (tabbed["field"], tabbed["key_id"]) == ("team", bad.key_id)
    assert "control characters" in tabbed["reason"] and tabbed["event"]["team"] == "tab\there"
    errors = [fields for level, event, fields in log.lines if level == "error"]
    assert {f["dead_letter"] for f in errors} == {item["id"] for item in page["data"]}
    await exporter.refresh_stats()
    assert _gauge(exporter.metrics, "switchyard_usage_dead_letters") == 2
    assert _gauge(exporter.metrics, "switchyard_usage_exported_total", "rejected") == 2

    # The cause is not fixed yet: nothing is stored, both letters stay.
    unfixed = await letters.replay()
    assert unfixed["replayed"] == [] and unfixed["remaining"] == 2
    # The label corrected for that letter: stored once, the letter gone; a second replay of
    # the same id finds nothing (and the store would count a re-delivery nothing anyway).
    fixed = await letters.replay([tabbed["id"]], {"team": "tab here"})
    assert (fixed["replayed"], fixed["inserted"], fixed["remaining"]) == ([tabbed["id"]], 1, 1)
    assert (await letters.replay([tabbed["id"]], {"team": "tab here"}))["replayed"] == []
    stored = (await store.list_events(EventQuery(limit=1000))).events
    assert [e.team for e in stored if e.event_id == "tabbed"] == ["tab here"]
    today = bad.day
    total = await store.rollup(RollupQuery(today, today + timedelta(days=1)))
    assert total[0].totals.requests == 31
    assert total[0].totals.cost_nanos == sum(e.cost_nanos for e in good) + bad.cost_nanos


async def _refuse_one_event(store: UsageStore, event_id: str) -> None:
    """A trigger that makes the database refuse one event id (a constraint the ledger's own
    checks know nothing of)."""
    url: str = store.test_url  # type: ignore[attr-defined]
    if store.kind == "sqlite":
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute(
                "CREATE TRIGGER refuse_one BEFORE INSERT ON usage_events"
                f" WHEN NEW.event_id = '{event_id}'"
                " BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END"
            )
        return
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "CREATE FUNCTION refuse_one() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            f" IF NEW.event_id = '{event_id}' THEN RAISE EXCEPTION 'refused by a trigger'"
            " USING ERRCODE = 'check_violation'; END IF; RETURN NEW; END $$"
        )
        await conn.execute(
            "CREATE TRIGGER refuse_one BEFORE INSERT ON usage_events"
            " FOR EACH ROW EXECUTE FUNCTION refuse_one()"
        )
    finally:
        await conn.close()


async def _allow_it_again(store: UsageStore) -> None:
    url: str = store.test_url  # type: ignore[attr-defined]
    if store.kind == "sqlite":
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute("DROP TRIGGER refuse_one")
        return
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("DROP TRIGGER refuse_one ON usage_events")
    finally:
        await conn.close()


async def test_an_event_the_database_refuses_is_kept_and_replayed_after_the_fix(
    redis_client: Redis, store: UsageStore
) -> None:
    buffer, exporter, log = await _setup(redis_client, store)
    events = make_events(40, seed=62, days=1)
    poison = events[17].event_id
    await _refuse_one_event(store, poison)
    await _record(buffer, [(e.event_id, e.to_json()) for e in events])

    assert await exporter.drain() == 40  # one round: the batch is split around the refusal
    assert await _stored_ids(store) == {e.event_id for e in events} - {poison}
    assert (await buffer.stats()).backlog == 0
    page = await store.dead_letters(DeadLetterQuery())
    assert [(letter.event_id, letter.field) for letter in page.letters] == [(poison, "store")]
    assert "refused by a trigger" in page.letters[0].reason
    assert UsageEvent.from_json(page.letters[0].payload) == events[17]  # kept byte for byte
    assert [f["event_id"] for level, _, f in log.lines if level == "error"] == [poison]

    letters = DeadLetters(store)
    still = await letters.replay()
    assert still["replayed"] == [] and [r["id"] for r in still["refused"]] == [
        page.letters[0].letter_id
    ]
    assert "refused by a trigger" in still["refused"][0]["reason"]
    await _allow_it_again(store)
    replayed = await letters.replay()
    assert replayed["replayed"] == [page.letters[0].letter_id] and replayed["remaining"] == 0
    assert await _stored_ids(store) == {e.event_id for e in events}
    await exporter.refresh_stats()
    assert _gauge(exporter.metrics, "switchyard_usage_dead_letters") == 0


def test_the_admin_api_lists_and_replays_dead_letters(gateway: Any, clean_redis: str) -> None:
    """Over HTTP on a running gateway (its own exporter): the letter is listed to a viewer,
    replayed by an admin (a bad correction is a 400 naming it), in the audit log, and the
    event then shows in ``/admin/usage/events`` of its key; the alert's metric is exposed."""
    import httpx
    import redis
    from polling import wait_for

    key_id, _ = gateway.create_key(name="old-key")
    event = UsageEvent.from_dict(
        {**make_events(1, seed=63, days=1)[0].to_dict(), "key_id": key_id, "team": "tab\there"}
    )
    client = redis.Redis.from_url(clean_redis)
    try:  # the gateway's buffer (its store's id names it), as an old key's request left it
        shard = wait_for(lambda: client.keys("sy:usage:{*.0}:buffer"))[0]
        client.xadd(shard, {FIELD: event.to_json()})
    finally:
        client.close()
    with gateway.admin() as admin:

        def listed() -> list[dict[str, Any]]:
            body = admin.get("/admin/usage/dead-letters", params={"limit": 500}).json()
            return [item for item in body["data"] if item["event_id"] == event.event_id]

        letter = wait_for(listed)[0]
        assert letter["key_id"] == key_id and letter["field"] == "team"
        token = admin.post("/admin/tokens", json={"name": "dl-viewer", "role": "viewer"}).json()
        viewer = {"Authorization": f"Bearer {token['token']}"}
        base = gateway.base_url
        assert httpx.get(base + "/admin/usage/dead-letters", headers=viewer).status_code == 200
        assert (
            httpx.post(base + "/admin/usage/dead-letters/replay", json={}, headers=viewer)
        ).status_code == 403

        bad = admin.post("/admin/usage/dead-letters/replay", json={"set": {"team": "a\tb"}})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "set.team"
        unfixed = admin.post("/admin/usage/dead-letters/replay", json={"ids": [letter["id"]]})
        assert unfixed.status_code == 200 and unfixed.json()["replayed"] == []
        assert [r["id"] for r in unfixed.json()["refused"]] == [letter["id"]]
        fixed = admin.post(
            "/admin/usage/dead-letters/replay",
            json={"ids": [letter["id"]], "set": {"team": "tab here"}},
        ).json()
        assert fixed["replayed"] == [letter["id"]] and fixed["inserted"] == 1
        assert not listed()
        events = admin.get("/admin/usage/events", params={"key": key_id}).json()["data"]
        assert [(e["id"], e["team"]) for e in events] == [(event.event_id, "tab here")]
        audit = admin.get("/admin/audit", params={"action": "usage.replay"}).json()["data"]
        assert [entry["after"] for entry in audit] == [  # newest first
            {"set": {"team": "tab here"}, "replayed": 1, "refused": 0, "remaining": 0},
            {"set": {}, "replayed": 0, "refused": 1, "remaining": 1},
        ]
        metrics = admin.get("/metrics").text
    assert "switchyard_usage_dead_letters " in metrics
    assert '"usage_export_rejected"' in gateway.output() and '"level":"error"' in gateway.output()
