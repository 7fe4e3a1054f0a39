"""Gateway processes, the test policy, a mixed client workload and the reconciliation check.

Gateways run as real ``python -m gateway serve`` processes (so one can be killed with SIGKILL),
clients are the official ``openai`` SDK. Every request carries a unique tag in ``user``; the
provider books tokens per tag, the client notes the gateway's usage id per tag, and the ledger's
events are joined to both.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
from counting_provider import ProviderRecord
from gateway_runner import GatewayProcess

# USD per 1M tokens; odd figures (fractions of a micro-dollar a request) so that any rounding
# per event would show.
PRICES = {
    "m-alpha": {"input": 1.25, "output": 10.0},
    "m-beta": {"input": 0.15, "output": 0.6, "cached_input": 0.075},
    "m-flaky": {"input": 3.0, "output": 15.0},
    "m-drip": {"input": 0.4, "output": 1.6},
    "m-mute": {"input": 0.5, "output": 1.5},
    "m-exact": {"input": 0.15, "output": 0.6},  # $7.2e-6 for 12 + 9 tokens
    "m-embed": {"input": 0.02},  # 25 tokens: $5e-7, below a micro-dollar
}
UPSTREAM = {
    "m-alpha": "alpha-plain",
    "m-beta": "beta-cache",
    "m-flaky": "alpha-flaky",
    "m-drip": "beta-drip-cont",
    "m-mute": "alpha-drip-mute",
    "m-exact": "exact-plain",
    "m-embed": "embed-plain",
}
MODEL_OF_UPSTREAM = {upstream: model for model, upstream in UPSTREAM.items()}
PROVIDER_OF = {
    "m-alpha": "a",
    "m-beta": "b",
    "m-flaky": "a",
    "m-drip": "b",
    "m-mute": "a",
    "m-exact": "b",
    "m-embed": "a",
}


def policy_yaml(base_url: str) -> str:
    lines = [
        "providers:",
        f"  a: {{base_url: {base_url}, timeout_s: 30}}",
        f"  b: {{base_url: {base_url}, timeout_s: 30}}",
        "models:",
    ]
    for model, price in PRICES.items():
        rendered = ", ".join(f"{k}: {v}" for k, v in price.items())
        lines.append(
            f"  {model}: {{provider: {PROVIDER_OF[model]}, upstream_model: {UPSTREAM[model]}, "
            f"price: {{{rendered}}}}}"
        )
    lines += ["fallbacks:", "  m-flaky: [m-beta]"]
    return "\n".join(lines) + "\n"


def expected_nanos(model: str, served: ProviderRecord) -> int:
    """The provider-side bill of one request in nano-dollars: exact decimal arithmetic on the
    price list (USD per 1M tokens), no rounding (the prices make it a whole number)."""
    price = {k: Decimal(str(v)) for k, v in PRICES[model].items()}
    cached_rate = price.get("cached_input", price["input"])
    usd = (
        (served.prompt - served.cached) * price["input"]
        + served.cached * cached_rate
        + served.completion * price.get("output", Decimal(0))
    ) / Decimal(1_000_000)
    nanos = usd.scaleb(9)
    assert nanos == nanos.to_integral_value(), nanos
    return int(nanos)


def run_usage_cli(gateway: GatewayProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """``switchyard usage report ARGS`` against the gateway's Redis, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", "usage", "report", *args],
        env=gateway.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def metered_gateway(
    redis_url: str, data_dir: Path, policy_file: Path, **settings: str
) -> GatewayProcess:
    """A gateway process on ``redis_url`` that tries each candidate once and writes no access
    lines (the workloads are large)."""
    return GatewayProcess(
        data_dir,
        policy_file,
        redis_url=redis_url,
        upstream_max_tries=1,
        access_log="false",
        **settings,
    )


@dataclass
class Call:
    """One client request and what the client saw."""

    tag: str
    model: str
    kind: str  # json | stream | disconnect
    max_tokens: int
    words: int
    usage_id: str | None = None
    answered: bool = False  # a full answer: a JSON body, or a stream through [DONE]
    status: int | None = None
    error: str | None = None
    chunks_seen: int = 0
    ended_at: float | None = None  # time.monotonic() when the client was done with it


@dataclass
class Workload:
    calls: list[Call] = field(default_factory=list)

    @classmethod
    def mixed(cls, count: int, prefix: str) -> Workload:
        """json / stream on alpha and beta, fallbacks from flaky, and mid-stream disconnects."""
        plan = [
            ("m-alpha", "json"),
            ("m-beta", "stream"),
            ("m-flaky", "json"),
            ("m-alpha", "stream"),
            ("m-flaky", "stream"),
            ("m-beta", "json"),
            ("m-drip", "disconnect"),
            ("m-alpha", "json"),
            ("m-beta", "stream"),
            ("m-drip", "stream"),
        ]
        calls = []
        for i in range(count):
            model, kind = plan[i % len(plan)]
            max_tokens = 6 if model == "m-drip" else 1 + i % 9
            calls.append(Call(f"{prefix}{i:05d}", model, kind, max_tokens, 2 + i % 13))
        return cls(calls)


async def run_call(client: openai.AsyncOpenAI, call: Call) -> None:
    try:
        await _request(client, call)
    finally:
        call.ended_at = time.monotonic()


async def _request(client: openai.AsyncOpenAI, call: Call) -> None:
    messages = [{"role": "user", "content": " ".join(["word"] * call.words)}]
    try:
        if call.kind == "json":
            raw = await client.chat.completions.with_raw_response.create(
                model=call.model, messages=messages, max_tokens=call.max_tokens, user=call.tag
            )
            call.usage_id = raw.headers.get("x-switchyard-usage-id")
            call.status = raw.status_code
            call.answered = raw.parse().usage is not None
            return
        async with client.chat.completions.with_streaming_response.create(
            model=call.model,
            messages=messages,
            max_tokens=call.max_tokens,
            user=call.tag,
            stream=True,
        ) as response:
            call.usage_id = response.headers.get("x-switchyard-usage-id")
            call.status = response.status_code
            async for line in response.iter_lines():
                if line == "data: [DONE]":
                    call.answered = True
                elif line.startswith("data: "):
                    call.chunks_seen += 1
                    if call.kind == "disconnect" and call.chunks_seen == 2:
                        return  # leaving the block closes the connection mid-stream
    except Exception as exc:  # any failure (SDK or transport) means "not answered"
        call.error = type(exc).__name__


async def run_workload(
    base_urls: list[str],
    keys: list[str],
    workload: Workload,
    concurrency: int = 300,
    pace_s: float = 0.0,
) -> None:
    """All calls at once (bounded by ``concurrency``), or one every ``pace_s`` seconds, spread
    round-robin over gateways and keys."""
    clients = [
        openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)
        for url in base_urls
        for key in keys
    ]
    gate = asyncio.Semaphore(concurrency)

    async def one(index: int, call: Call) -> None:
        await asyncio.sleep(index * pace_s)
        async with gate:
            await run_call(clients[index % len(clients)], call)

    try:
        await asyncio.gather(*(one(i, call) for i, call in enumerate(workload.calls)))
    finally:
        for client in clients:
            await client.close()


def all_events(admin: httpx.Client) -> dict[str, dict[str, Any]]:
    """Every ledger event, by usage id, paged through ``/admin/usage/events``."""
    events: dict[str, dict[str, Any]] = {}
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 500}
        if cursor:
            params["cursor"] = cursor
        page = admin.get("/admin/usage/events", params=params)
        assert page.status_code == 200, page.text
        body = page.json()
        for event in body["data"]:
            assert event["request_id"] not in events, "an event was recorded twice"
            events[event["request_id"]] = event
        cursor = body.get("next_cursor")
        if not cursor:
            return events


def wait_for_events(admin: httpx.Client, count: int, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        events = all_events(admin)
        if len(events) >= count or time.monotonic() > deadline:
            return events
        time.sleep(0.2)


@dataclass
class Reconciled:
    events: int
    prompt: int
    completion: int
    cached: int
    cost_nanos: int
    estimated: int


def delivered_books(
    books: dict[str, ProviderRecord], calls: list[Call], events: dict[str, dict[str, Any]]
) -> dict[str, ProviderRecord]:
    """The provider's books as far as the gateway could see them.

    A client that leaves a stream mid-way is a race the gateway cannot win exactly: the
    provider bills every chunk it produced until it noticed the closed connection, and those
    written after the gateway's last read never reach it (real providers bill them too). So
    such a request's event may trail the provider's count, never pass it; every other request
    must match to the token.
    """
    delivered = dict(books)
    for call in calls:
        event = events.get(call.usage_id or "")
        served = books.get(call.tag)
        if call.kind != "disconnect" or event is None or served is None:
            continue
        seen = event["completion_tokens"]
        assert seen <= served.completion, f"{call.tag}: recorded more than the provider produced"
        delivered[call.tag] = replace(served, completion=seen)
    return delivered


def reconcile(
    books: dict[str, ProviderRecord],
    calls: list[Call],
    events: dict[str, dict[str, Any]],
    *,
    answers_complete: bool = True,
) -> Reconciled:
    """Join client calls, provider books and ledger events per request; check each event.

    Every answered call has an event; every event matches the provider's own record of that
    request to the token and its bill to the nano-dollar. Returns the ledger's totals.
    """
    by_usage_id = {call.usage_id: call for call in calls if call.usage_id}
    books = delivered_books(books, calls, events)
    for call in calls:
        if call.answered:
            assert call.usage_id in events, f"answered request {call.tag} has no usage event"
    totals = Reconciled(0, 0, 0, 0, 0, 0)
    for usage_id, event in events.items():
        call = by_usage_id.get(usage_id)
        assert call is not None, f"event {usage_id} matches no client request"
        served = books.get(call.tag)
        assert served is not None, f"{call.tag}: recorded but the provider never served it"
        model = MODEL_OF_UPSTREAM[served.model]
        where = f"{call.tag} ({call.kind} via {model})"
        assert event["model"] == model, where
        assert event["prompt_tokens"] == served.prompt, where
        assert event["completion_tokens"] == served.completion, where
        assert event["cached_tokens"] == served.cached, where
        assert event["cost_nanos"] == expected_nanos(model, served), where
        assert event["usage_source"] == ("provider" if served.reported else "estimated"), where
        assert event["streamed"] == (call.kind != "json"), where
        if answers_complete:  # (a killed gateway may record an answer it never delivered)
            assert event["status"] == (200 if call.answered else 499), where
        totals.events += 1
        totals.prompt += event["prompt_tokens"]
        totals.completion += event["completion_tokens"]
        totals.cached += event["cached_tokens"]
        totals.cost_nanos += event["cost_nanos"]
        totals.estimated += event["usage_source"] == "estimated"
    return totals


def reconciled_ledger(
    admin: httpx.Client,
    books: dict[str, ProviderRecord],
    calls: list[Call],
    count: int,
    *,
    timeout: float = 30,
    answers_complete: bool = True,
    group_bys: tuple[str, ...] = ("model",),
) -> tuple[dict[str, dict[str, Any]], Reconciled]:
    """Wait for ``count`` ledger events, ``reconcile`` them with the books and the calls, and
    check that ``/admin/usage`` grouped each way of ``group_bys`` totals the same: the events,
    and the ledger's totals."""
    events = wait_for_events(admin, count, timeout)
    ledger = reconcile(books, calls, events, answers_complete=answers_complete)
    for group_by in group_bys:
        assert admin_report_totals(admin, group_by) == ledger, group_by
    return events, ledger


def provider_totals(books: dict[str, ProviderRecord]) -> Reconciled:
    totals = Reconciled(len(books), 0, 0, 0, 0, 0)
    for served in books.values():
        totals.prompt += served.prompt
        totals.completion += served.completion
        totals.cached += served.cached
        totals.cost_nanos += expected_nanos(MODEL_OF_UPSTREAM[served.model], served)
        totals.estimated += not served.reported
    return totals


def admin_report_totals(admin: httpx.Client, group_by: str = "model") -> Reconciled:
    report = admin.get("/admin/usage", params={"group_by": group_by, "format": "json"})
    assert report.status_code == 200, report.text
    rows = report.json()["data"]
    return Reconciled(
        sum(row["requests"] for row in rows),
        sum(row["prompt_tokens"] for row in rows),
        sum(row["completion_tokens"] for row in rows),
        sum(row["cached_tokens"] for row in rows),
        sum(row["cost_nanos"] for row in rows),
        sum(row["estimated"] for row in rows),
    )
