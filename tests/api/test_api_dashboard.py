"""The /admin/ui dashboard of a real gateway: login/cookie flow over HTTP (CSRF tokens
included), then the page rendered in headless Chromium after a login through its form, whose
DOM numbers must equal the JSON report and the event sums."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
from chromium import CHROMIUM, chromium_page
from dashboard_client import LOGIN_CSRF_COOKIE, SESSION_COOKIE, csrf_in
from gateway_runner import ADMIN_KEY, GatewayThread, RunningGateway, make_settings
from usage_events import expected_groups, make_events

from gateway.api.dashboard.view import KEY_SERIES, TOP_KEYS
from gateway.ledger import UsageEvent
from gateway.metering.exporter import UsageExporter
from gateway.metering.recorder import UsageRecorder
from gateway.metering.reports import UsageReports
from gateway.store.scripts import ScriptBatch

REPO_ROOT = Path(__file__).resolve().parents[2]
KEYS_LISTED = 11  # events name 12 keys: the 12th has usage but no key record ("unlisted")
POLICY = """
providers:
  up: {base_url: "http://127.0.0.1:9/v1"}
models:
  some-model: {provider: up}
"""


class DomNumbers(HTMLParser):
    """Collects the data-* attributes the dashboard renders for its numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.chart: str | None = None
        self.bars: dict[str, list[dict[str, str]]] = defaultdict(list)
        self.metrics: dict[str, str] = {}
        self.key_rows: dict[str, dict[str, str]] = {}
        self.titles = 0
        self.freshness: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "svg":
            self.chart = a.get("data-chart")
        elif tag == "rect" and self.chart:
            self.bars[self.chart].append(a)
        elif tag == "dd" and "data-metric" in a:
            self.metrics[a["data-metric"]] = a["data-value"]
        elif tag == "tr" and "data-key-id" in a:
            self.key_rows[a["data-key-id"]] = a
        elif tag == "title" and self.chart:
            self.titles += 1
        elif tag == "p" and "data-as-of" in a:
            self.freshness = a

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self.chart = None


def sums(bars: list[dict[str, str]], by: str) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for bar in bars:
        out[bar[by]] += int(bar["data-value"])
    return dict(out)


@dataclasses.dataclass
class Dashboard:
    gateway: RunningGateway
    events: list[UsageEvent]
    key_list: list[dict[str, Any]]  # the key records, as the admin API lists them


@pytest.fixture
async def dashboard(
    recorder: UsageRecorder, exporter: UsageExporter, clean_redis: str, tmp_path: Path
) -> AsyncIterator[Dashboard]:
    """A gateway on the test's Redis and usage store with 11 keys (every third revoked) and 400
    usage events over 12 key ids, the last of which has no key record."""
    policy = tmp_path / "routing_rules.yaml"
    policy.write_text(POLICY)
    store_url = f"sqlite:///{tmp_path / 'store' / 'usage' / 'usage.sqlite3'}"
    runner = GatewayThread(
        make_settings(tmp_path / "gw", policy, clean_redis, usage_store_url=store_url)
    )
    gateway = runner.start()
    try:
        ids = [gateway.create_key(name=f"service {i}")[0] for i in range(KEYS_LISTED)]
        with gateway.admin() as admin:
            for key_id in ids[1::3]:
                assert admin.post(f"/admin/keys/{key_id}/revoke").status_code == 200
            listed = admin.get("/admin/keys", params={"limit": 100}).json()["data"]
        real_id = {f"key{i}": key_id for i, key_id in enumerate(ids)}
        events = [
            dataclasses.replace(e, key_id=real_id.get(e.key_id, e.key_id))
            for e in make_events(400, seed=5, keys=KEYS_LISTED + 1, days=6)
        ]
        batch = ScriptBatch()
        for event in events:
            recorder.queue_record(batch, event)
        await batch.execute(recorder.buffer.redis)
        await exporter.drain()  # the gateway's own exporter may move some of them first
        yield Dashboard(gateway, events, listed)
    finally:
        runner.stop()


async def test_login_and_cookie_flow(dashboard: Dashboard) -> None:
    base = dashboard.gateway.base_url
    async with httpx.AsyncClient(base_url=base) as client:
        anonymous = await client.get("/admin/ui")
        assert anonymous.status_code == 401 and 'name="key"' in anonymous.text
        csrf = csrf_in(anonymous.text)  # the login form's double-submit token
        form_cookie = {"cookie": f"{LOGIN_CSRF_COOKIE}={csrf}"}
        assert f"{LOGIN_CSRF_COOKIE}={csrf}" in anonymous.headers["set-cookie"]
        wrong = await client.post(
            "/admin/ui/login", data={"key": "nope", "csrf": csrf}, headers=form_cookie
        )
        assert wrong.status_code == 401 and "not the admin key" in wrong.text
        assert SESSION_COOKIE not in wrong.headers["set-cookie"]
        as_json = await client.post("/admin/ui/login", json={"key": ADMIN_KEY})
        assert as_json.status_code == 400
        forged = await client.get("/admin/ui", headers=_session("9999999999.deadbeef"))
        assert forged.status_code == 401

        ok = await client.post(
            "/admin/ui/login", data={"key": ADMIN_KEY, "csrf": csrf}, headers=form_cookie
        )
        assert ok.status_code == 303 and ok.headers["location"] == "/admin/ui"
        cookie = ok.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/admin" in cookie
        assert "secure" in cookie  # by default, even on http://127.0.0.1
        assert ADMIN_KEY.lower() not in cookie  # a random session id, never the key
        token = ok.cookies["sy_admin_session"]
        page = await client.get("/admin/ui", headers=_session(token))
        assert page.status_code == 200 and 'data-chart="spend-by-model"' in page.text
        assert "no-store" in page.headers["cache-control"]
        bad = await client.get("/admin/ui", params={"from": "someday"}, headers=_session(token))
        assert bad.status_code == 400 and 'data-param="from"' in bad.text
        refused = await client.post(
            "/admin/ui/logout", data={"csrf": "guessed"}, headers=_session(token)
        )
        assert refused.status_code == 403  # no CSRF token: the session lives on
        out = await client.post(
            "/admin/ui/logout", data={"csrf": csrf_in(page.text)}, headers=_session(token)
        )
        assert out.status_code == 303
        assert "max-age=0" in out.headers["set-cookie"].lower()
        # Ended server-side: the cookie a client kept is worth nothing now.
        assert (await client.get("/admin/ui", headers=_session(token))).status_code == 401


def _session(token: str) -> dict[str, str]:
    """The session cookie by hand: it is Secure, and httpx keeps those off plain http."""
    return {"cookie": f"sy_admin_session={token}"}


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
async def test_dashboard_in_headless_chromium(
    dashboard: Dashboard, reports: UsageReports, tmp_path: Path
) -> None:
    events = dashboard.events
    artifacts = REPO_ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    screenshot = artifacts / "dashboard.png"
    screenshot.unlink(missing_ok=True)
    async with chromium_page(tmp_path / "chromium", size="1600,2600") as tools:
        base = dashboard.gateway.base_url
        await tools.open(base + "/admin/ui", "document.querySelector('input[name=key]')")
        await tools.submit(
            "form[action='/admin/ui/login']",
            {"key": ADMIN_KEY},
            "document.querySelectorAll('svg rect').length > 0",
        )
        dom = await tools.html()
        await tools.screenshot(screenshot)

    numbers = DomNumbers()
    numbers.feed(dom)
    assert numbers.bars, "the dashboard did not render (login flow failed?):\n" + dom[:2000]
    end = reports.today()
    start = end - timedelta(days=13)
    by_model = {r["model"]: r for r in (await reports.admin_usage(start, end, "model"))["data"]}
    by_day = {r["day"]: r for r in (await reports.admin_usage(start, end, "day"))["data"]}
    by_key_rows = (await reports.admin_usage(start, end, "key"))["data"]
    by_key = {r["key"]: r for r in by_key_rows}

    spend = numbers.bars["spend-by-model"]
    assert sums(spend, "data-series") == {m: r["cost_nanos"] for m, r in by_model.items()}
    assert sums(spend, "data-day") == {
        d: r["cost_nanos"] for d, r in by_day.items() if r["cost_nanos"]
    }
    # ...and independently of the report code, equal to the events' own sums.
    assert sums(spend, "data-series") == {
        m: g["cost_nanos"] for m, g in expected_groups(events, "model").items()
    }
    tokens = numbers.bars["tokens-by-model"]
    assert sums(tokens, "data-series") == {m: r["total_tokens"] for m, r in by_model.items()}

    per_key = sums(numbers.bars["spend-by-key"], "data-series")
    top = [r["key"] for r in by_key_rows[:KEY_SERIES]]
    assert {k: per_key[k] for k in top} == {k: by_key[k]["cost_nanos"] for k in top}
    assert per_key["other keys"] == sum(r["cost_nanos"] for r in by_key_rows[KEY_SERIES:])

    tokens_per_key = sums(numbers.bars["tokens-by-key"], "data-series")
    assert {k: tokens_per_key[k] for k in top} == {k: by_key[k]["total_tokens"] for k in top}
    assert tokens_per_key["other keys"] == sum(r["total_tokens"] for r in by_key_rows[KEY_SERIES:])

    ranked = [(b["data-series"], int(b["data-value"])) for b in numbers.bars["top-keys"]]
    assert ranked == [(r["key"], r["cost_nanos"]) for r in by_key_rows[:TOP_KEYS]]

    rates = {b["data-day"]: int(b["data-value"]) for b in numbers.bars["error-rate"]}
    assert rates == {
        d: round(10_000 * r["errors"] / r["requests"]) for d, r in by_day.items() if r["errors"]
    }

    totals = (await reports.admin_usage(start, end, "key"))["totals"]
    assert (
        int(numbers.metrics["cost_nanos"])
        == totals["cost_nanos"]
        == sum(e.cost_nanos for e in events)
    )
    assert int(numbers.metrics["total_tokens"]) == totals["total_tokens"]
    assert int(numbers.metrics["requests"]) == totals["requests"] == len(events)
    assert float(numbers.metrics["error_rate"]) == totals["error_rate"]

    assert {entry["status"] for entry in dashboard.key_list} == {"active", "revoked"}
    for entry in dashboard.key_list:
        row = numbers.key_rows[entry["id"]]
        assert row["data-status"] == entry["status"]
        assert (
            int(row["data-cost-nanos"]) == by_key.get(entry["id"], {"cost_nanos": 0})["cost_nanos"]
        )
    assert numbers.key_rows[f"key{KEYS_LISTED}"]["data-status"] == "unlisted"
    assert numbers.titles >= len(spend)  # every bar has its tooltip
    # The page says how fresh it is: every event recorded was exported before it was drawn.
    assert numbers.freshness["data-pending-export"] == "0"
    assert numbers.freshness["data-as-of"].startswith(end.isoformat())

    assert screenshot.exists() and screenshot.stat().st_size > 10_000
    print(f"\ndashboard screenshot: {screenshot}")
