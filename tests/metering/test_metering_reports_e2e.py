"""The reports over a running gateway: ``/v1/usage``, ``/admin/usage`` (JSON, CSV, errors),
``switchyard usage report`` (table, CSV, JSON, --from/--to/--group-by), and a stream whose
provider never reports usage, cut by the client: charged for what upstream produced, marked
estimated."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
import openai
from counting_provider import CountingProvider
from gateway_runner import GatewayProcess
from usage_workload import (
    Workload,
    delivered_books,
    provider_totals,
    reconcile,
    run_usage_cli,
    run_workload,
    wait_for_events,
)

from gateway.routing.estimate import estimate_prompt_tokens


async def test_reports_http_and_cli_agree_with_the_provider(
    gateway: GatewayProcess, provider: CountingProvider
) -> None:
    key_id, key = gateway.create_key(name="reports", team="=cmd")  # a formula-like team
    work = Workload.mixed(40, "p")
    await run_workload([gateway.url], [key], work)
    books = provider.snapshot()
    with gateway.admin() as admin:
        events = wait_for_events(admin, 40)
        reconcile(books, work.calls, events)
        expected = provider_totals(delivered_books(books, work.calls, events))
        by_model = admin.get("/admin/usage", params={"group_by": "model"}).json()
        for param, value in (("format", "xml"), ("group_by", "colour"), ("from", "2024-13-01")):
            bad = admin.get("/admin/usage", params={param: value})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == param
        page = admin.get("/admin/usage/events", params={"limit": 7, "key": key_id}).json()
        assert len(page["data"]) == 7 and page["next_cursor"]
        assert admin.get("/admin/usage/events", params={"limit": 0}).status_code == 400
    assert by_model["totals"]["cost_nanos"] == expected.cost_nanos

    auth = {"Authorization": f"Bearer {key}"}
    own = httpx.get(gateway.url + "/v1/usage", params={"days": 30}, headers=auth).json()
    assert own["requests"] == 40 and own["total_cost_nanos"] == expected.cost_nanos
    bad_days = httpx.get(gateway.url + "/v1/usage", params={"days": 0}, headers=auth)
    assert bad_days.status_code == 400 and bad_days.json()["error"]["param"] == "days"

    as_json = run_usage_cli(gateway, "--group-by", "model", "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["data"] == by_model["data"]

    today = datetime.now(UTC).date()
    as_csv = run_usage_cli(gateway, "--group-by", "team", "--format", "csv", "--from", str(today))
    assert as_csv.returncode == 0, as_csv.stderr
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert [r["team"] for r in rows] == ["'=cmd"]  # defused for spreadsheets
    assert int(rows[0]["prompt_tokens"]) == expected.prompt
    assert int(rows[0]["cost_nanos"]) == expected.cost_nanos
    assert Decimal(rows[0]["cost"]) * 10**9 == expected.cost_nanos

    table = run_usage_cli(gateway, "--group-by", "model")
    assert table.returncode == 0, table.stderr
    print("\n" + table.stdout)
    total_line = table.stdout.strip().splitlines()[-1].split()
    assert total_line[:4] == ["TOTAL", "40", str(expected.prompt), str(expected.completion)]
    assert Decimal(total_line[5]) * 10**9 == expected.cost_nanos  # exact, all 9 decimals
    assert {line.split()[0] for line in table.stdout.splitlines()[3:-2]} == {
        row["model"] for row in by_model["data"]
    }

    past = str(today - timedelta(days=3))
    empty = run_usage_cli(gateway, "--from", past, "--to", past, "--format", "json")
    assert json.loads(empty.stdout)["totals"]["requests"] == 0
    wrong = run_usage_cli(gateway, "--from", "yesterday")
    assert wrong.returncode == 1 and "--from" in wrong.stderr and "YYYY-MM-DD" in wrong.stderr
    backwards = run_usage_cli(gateway, "--from", str(today), "--to", past)
    assert backwards.returncode == 1 and "error" in backwards.stderr


async def test_cut_stream_without_provider_usage_is_charged_as_produced_and_estimated(
    gateway: GatewayProcess, provider: CountingProvider
) -> None:
    _, key = gateway.create_key(name="mute")
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)
    messages = [{"role": "user", "content": "one two three four five six"}]
    async with client.chat.completions.with_streaming_response.create(
        model="m-mute", messages=messages, max_tokens=8, user="mute-1", stream=True
    ) as response:
        usage_id = response.headers["x-switchyard-usage-id"]
        seen = 0
        async for line in response.iter_lines():
            seen += line.startswith("data: ")
            if seen == 3:
                break
    await client.close()
    with gateway.admin() as admin:
        event = wait_for_events(admin, 1)[usage_id]
    deadline = time.monotonic() + 5
    while "mute-1" not in provider.snapshot() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # it books once it notices the closed connection
    served = provider.snapshot()["mute-1"]
    assert not served.reported and served.completion == 3  # stopped once we left
    assert event["usage_source"] == "estimated" and event["status"] == 499
    assert event["completion_tokens"] == served.completion
    estimate = estimate_prompt_tokens({"model": "m-mute", "messages": messages})
    assert event["prompt_tokens"] == estimate
    assert event["streamed"] is True and event["ttft_ms"] is not None
