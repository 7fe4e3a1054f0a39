"""Reports over a filled usage store (events recorded into the Redis buffer, then exported):
per key, admin group-by with date ranges, CSV, event pages, freshness, and the same numbers
from the HTTP endpoints of a real gateway on the same store."""

from __future__ import annotations

import csv
import dataclasses
import io
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_runner import ADMIN_KEY, GatewayThread, make_settings
from usage_events import dimensions, expected_groups, make_events, pick

from gateway.ledger import UsageEvent, UsageStore
from gateway.metering.exporter import UsageExporter
from gateway.metering.recorder import UsageRecorder
from gateway.metering.reports import GROUP_BYS, ReportError, UsageReports, event_view
from gateway.store.scripts import ScriptBatch

FRESHNESS = ("as_of", "pending_export", "export_lag_s")


async def record_all(recorder: UsageRecorder, events: list[UsageEvent]) -> None:
    """Record ``events`` into the buffer as the settle batch does (one round trip)."""
    batch = ScriptBatch()
    for event in events:
        recorder.queue_record(batch, event)
    await batch.execute(recorder.buffer.redis)


def figures(report: dict[str, Any]) -> dict[str, Any]:
    """A report without its freshness fields (``as_of`` differs between two reads)."""
    return {name: value for name, value in report.items() if name not in FRESHNESS}


@pytest.fixture
async def filled(recorder: UsageRecorder, exporter: UsageExporter) -> list[UsageEvent]:
    events = make_events(300, seed=3, keys=6, days=4)
    await record_all(recorder, events)
    assert await exporter.drain() == 300
    return events


async def test_freshness_counts_what_is_not_exported_yet(
    reports: UsageReports, recorder: UsageRecorder, exporter: UsageExporter
) -> None:
    today = reports.today()
    empty = await reports.admin_usage(today, today, "key")
    assert empty["pending_export"] == 0 and empty["export_lag_s"] == 0
    assert empty["as_of"].endswith("Z") and empty["as_of"][:10] == today.isoformat()
    events = make_events(7, seed=9, days=1)
    await record_all(recorder, events)
    waiting = await reports.admin_usage(today, today, "key")
    assert waiting["pending_export"] == 7 and waiting["totals"]["requests"] == 0
    assert waiting["export_lag_s"] >= 0
    await exporter.drain()
    done = await reports.admin_usage(today, today, "key")
    assert done["pending_export"] == 0 and done["totals"]["requests"] == 7


async def test_admin_report_every_group_by_and_range(
    reports: UsageReports, filled: list[UsageEvent]
) -> None:
    end = reports.today()
    for start, stop in (
        (end - timedelta(days=3), end),
        (end - timedelta(days=2), end - timedelta(days=1)),
    ):
        inside = [e for e in filled if start <= e.day <= stop]
        for by in GROUP_BYS:
            report = await reports.admin_usage(start, stop, by)
            got = {row[by]: pick(row) for row in report["data"] if row["requests"]}
            assert got == expected_groups(inside, by), (by, start, stop)
            counted = [e for e in inside if dimensions(e, by)]  # by batch: the batches' lines
            assert report["totals"]["cost_nanos"] == sum(e.cost_nanos for e in counted)
            assert report["totals"]["total_tokens"] == sum(e.total_tokens for e in counted)
            costs = [row["cost_nanos"] for row in report["data"]]
            if by != "day":
                assert costs == sorted(costs, reverse=True)
        days = await reports.admin_usage(start, stop, "day")
        assert [row["day"] for row in days["data"]] == [
            (start + timedelta(days=i)).isoformat() for i in range((stop - start).days + 1)
        ]


async def test_usage_for_key(reports: UsageReports, filled: list[UsageEvent]) -> None:
    today = reports.today()
    recent = [e for e in filled if e.key_id == "key2" and e.day >= today - timedelta(days=1)]
    usage = await reports.usage_for_key("key2", days=2)
    assert usage["requests"] == len(recent)
    assert usage["total_cost_nanos"] == sum(e.cost_nanos for e in recent)
    assert usage["total_cost"] == sum(e.cost_nanos for e in recent) / 1_000_000_000
    assert usage["total_tokens"] == sum(e.total_tokens for e in recent)
    assert usage["prompt_tokens"] == sum(e.prompt_tokens for e in recent)
    assert usage["completion_tokens"] == sum(e.completion_tokens for e in recent)
    assert {m["model"]: pick(m) for m in usage["by_model"]} == expected_groups(recent, "model")
    assert [d["date"] for d in usage["by_day"]] == [
        (today - timedelta(days=1)).isoformat(),
        today.isoformat(),
    ]
    assert {d["date"]: pick(d) for d in usage["by_day"] if d["requests"]} == expected_groups(
        recent, "day"
    )
    empty = await reports.usage_for_key("no-such-key", days=30)
    assert empty["requests"] == 0 and empty["total_cost"] == 0 and len(empty["by_day"]) == 30


async def test_bad_report_parameters(reports: UsageReports) -> None:
    today = reports.today()
    with pytest.raises(ReportError) as caught:
        await reports.admin_usage(today, today, "colour")
    assert caught.value.param == "group_by"
    with pytest.raises(ReportError) as caught:
        await reports.admin_usage(today, today - timedelta(days=1), "key")
    assert caught.value.param == "from"
    with pytest.raises(ReportError) as caught:
        await reports.admin_usage(today - timedelta(days=90), today, "key")
    assert caught.value.param == "from"
    for days in (0, 31):
        with pytest.raises(ReportError) as caught:
            await reports.usage_for_key("key0", days=days)
        assert caught.value.param == "days"
    for cursor in ("!!!", "bm9waXBl"):
        with pytest.raises(ReportError) as caught:
            await reports.events(cursor=cursor)
        assert caught.value.param == "cursor"


async def test_events_pages_cover_everything_newest_first(
    reports: UsageReports, filled: list[UsageEvent]
) -> None:
    seen: list[dict] = []
    cursor = None
    while True:
        page = await reports.events(cursor=cursor, limit=17)
        assert len(page["data"]) <= 17
        seen.extend(page["data"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(e["request_id"] for e in seen) == sorted(e.event_id for e in filled)
    order = [(e["time_ms"], e["id"]) for e in seen]
    assert order == sorted(order, reverse=True)

    by_key = await reports.events(key="key1", limit=500)
    assert {e["request_id"] for e in by_key["data"]} == {
        e.event_id for e in filled if e.key_id == "key1"
    }
    assert by_key["next_cursor"] is None

    model_ids: list[str] = []
    cursor = None
    while True:
        page = await reports.events(model="qwen3:0.6b", cursor=cursor, limit=9)
        assert all(e["model"] == "qwen3:0.6b" for e in page["data"])
        model_ids.extend(e["request_id"] for e in page["data"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(model_ids) == sorted(e.event_id for e in filled if e.model == "qwen3:0.6b")
    first = await reports.events(limit=1)
    newest = next(e for e in filled if e.event_id == first["data"][0]["request_id"])
    assert first["data"][0] == event_view(newest)
    recorded = {**newest.to_dict(), "tags": list(newest.tags)}
    shown = first["data"][0]
    assert {k: shown[k] for k in recorded if k != "time"} == {
        k: v for k, v in recorded.items() if k != "time"
    }
    assert shown["time_ms"] == newest.time_ms


POLICY = """
providers:
  up: {base_url: "http://127.0.0.1:9/v1"}
models:
  some-model: {provider: up}
"""


async def test_http_endpoints(
    reports: UsageReports,
    recorder: UsageRecorder,
    exporter: UsageExporter,
    usage_store: UsageStore,
    filled: list[UsageEvent],
    clean_redis: str,
    tmp_path: Path,
) -> None:
    policy = tmp_path / "routing_rules.yaml"
    policy.write_text(POLICY)
    # The gateway shares the test's store (another connection to the same SQLite file).
    store_url = f"sqlite:///{tmp_path / 'store' / 'usage' / 'usage.sqlite3'}"
    settings = make_settings(
        tmp_path / "gw", policy, clean_redis, usage_store_url=store_url, usage_retention_days=30
    )
    runner = GatewayThread(settings)
    gateway = runner.start()
    try:
        assert gateway.services.usage_store.store_id == usage_store.store_id
        await _check_http_endpoints(gateway, reports, recorder, exporter, filled)
    finally:
        runner.stop()


async def _check_http_endpoints(
    gateway: Any,
    reports: UsageReports,
    recorder: UsageRecorder,
    exporter: UsageExporter,
    filled: list[UsageEvent],
) -> None:
    # key0's events again, under a key of the gateway's, for its own GET /v1/usage.
    key_id, api_key = gateway.create_key(name="reports")
    again = [
        dataclasses.replace(event, key_id=key_id, event_id=event.event_id + "-again")
        for event in filled
        if event.key_id == "key0"
    ]
    await record_all(recorder, again)
    await exporter.drain()  # the gateway's exporter may take some of them: either is fine
    today = reports.today()
    start = (today - timedelta(days=3)).isoformat()
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(base_url=gateway.base_url, headers=admin) as client:
        mine = {"Authorization": f"Bearer {api_key}"}
        own = (await client.get("/v1/usage", params={"days": 30}, headers=mine)).json()
        assert own["pending_export"] == 0
        assert figures(own) == figures(await reports.usage_for_key(key_id, days=30))
        key0 = await reports.usage_for_key("key0", days=30)
        assert figures(own) == {**figures(key0), "key_id": key_id}

        for by in GROUP_BYS:
            params = {"from": start, "to": today.isoformat(), "group_by": by}
            as_json = (await client.get("/admin/usage", params=params)).json()
            response = await client.get("/admin/usage", params={**params, "format": "csv"})
            assert response.headers["content-type"].startswith("text/csv")
            assert response.headers["x-usage-pending-export"] == "0"
            assert response.headers["x-usage-as-of"].endswith("Z")
            rows = list(csv.DictReader(io.StringIO(response.text)))
            assert len(rows) == len(as_json["data"])
            for row, want in zip(rows, as_json["data"], strict=True):
                name = want[by]
                assert row[by] == ("'" + name if name.startswith("=") else name)
                assert int(row["cost_nanos"]) == want["cost_nanos"]
                assert int(row["total_tokens"]) == want["total_tokens"]
                assert Decimal(row["cost"]) * 10**9 == want["cost_nanos"]  # exact decimal text
                assert len(row["cost"].split(".")[1]) == 9

        bad = {
            "/v1/usage?days=zero": "days",
            "/v1/usage?days=0": "days",
            "/admin/usage?group_by=colour": "group_by",
            "/admin/usage?format=xml": "format",
            "/admin/usage?from=2024-13-01": "from",
            "/admin/usage?to=yesterday": "to",
            f"/admin/usage?from={today.isoformat()}&to={start}": "from",
            "/admin/usage/events?limit=0": "limit",
            "/admin/usage/events?limit=ten": "limit",
            "/admin/usage/events?cursor=zzz": "cursor",
            "/admin/usage/events?key=a%20b": "key",
        }
        for url, param in bad.items():
            response = await client.get(url, headers=mine if url.startswith("/v1") else admin)
            assert response.status_code == 400, url
            error = response.json()["error"]
            assert error["param"] == param, url
            assert error["type"] == "invalid_request_error"
            assert param in error["message"], url

        page = (await client.get("/admin/usage/events", params={"limit": 5, "key": "key3"})).json()
        assert len(page["data"]) == 5 and {e["key_id"] for e in page["data"]} == {"key3"}
        rest = (
            await client.get(
                "/admin/usage/events",
                params={"cursor": page["next_cursor"], "key": "key3", "limit": 500},
            )
        ).json()
        ids = [e["request_id"] for e in page["data"] + rest["data"]]
        assert sorted(ids) == sorted(e.event_id for e in filled if e.key_id == "key3")
