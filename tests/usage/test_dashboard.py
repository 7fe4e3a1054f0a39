"""The /admin/ui dashboard: login/cookie flow over HTTP, then the page rendered in headless
Chromium, whose DOM numbers must equal the JSON report and the event sums."""

from __future__ import annotations

import asyncio
import hmac
import shutil
from collections import defaultdict
from datetime import timedelta
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from gateway.dashboard import KEY_SERIES, TOP_KEYS, DashboardAuth, dashboard_routes
from gateway.access.sessions import SessionStore
from gateway.metering.reports import UsageReports
from gateway.metering.ledger import UsageEvent, UsageLedger

from .helpers import expected_groups, make_events, serve

ADMIN_KEY = "sy-admin-test-key-7f3a"
REPO_ROOT = Path(__file__).resolve().parents[2]
KEY_LIST = [
    {
        "id": f"key{i}",
        "name": f"service {i}",
        "team": "search" if i % 2 else "support",
        "status": ("active", "revoked", "rotating")[i % 3],
    }
    for i in range(11)
]  # fmt: skip  (key11 has usage but is not listed: shown as "unlisted")


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class DomNumbers(HTMLParser):
    """Collects the data-* attributes the dashboard renders for its numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.chart: str | None = None
        self.bars: dict[str, list[dict[str, str]]] = defaultdict(list)
        self.metrics: dict[str, str] = {}
        self.key_rows: dict[str, dict[str, str]] = {}
        self.titles = 0

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

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self.chart = None


def sums(bars: list[dict[str, str]], by: str) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for bar in bars:
        out[bar[by]] += int(bar["data-value"])
    return dict(out)


@pytest.fixture
async def dashboard_app(
    ledger: UsageLedger, reports: UsageReports
) -> tuple[Starlette, list[UsageEvent]]:
    events = make_events(400, seed=5, keys=12, days=6)
    pipe = ledger.redis.pipeline(transaction=False)
    for e in events:
        ledger.add_record(pipe, e)
    await pipe.execute()

    auth = DashboardAuth(
        verify_admin_key=lambda key: hmac.compare_digest(key.encode(), ADMIN_KEY.encode()),
        sessions=SessionStore(ledger.redis, ADMIN_KEY, ttl_s=3600),
    )

    async def list_keys() -> list[dict[str, str]]:
        return KEY_LIST

    async def autologin(request: Request) -> HTMLResponse:
        # Test-only page: a browser "user" filling in and submitting the login form.
        return HTMLResponse(
            '<form method="post" action="/admin/ui/login">'
            f'<input name="key" value="{ADMIN_KEY}"></form>'
            "<script>document.forms[0].submit()</script>"
        )

    routes = [*dashboard_routes(reports=reports, auth=auth, list_keys=list_keys)]
    routes.append(Route("/test-login", autologin))
    return Starlette(routes=routes), events


async def test_login_and_cookie_flow(dashboard_app: tuple[Starlette, list[UsageEvent]]) -> None:
    app, _ = dashboard_app
    async with serve(app) as base, httpx.AsyncClient(base_url=base) as client:
        anonymous = await client.get("/admin/ui")
        assert anonymous.status_code == 401 and 'name="key"' in anonymous.text
        wrong = await client.post("/admin/ui/login", data={"key": "nope"})
        assert wrong.status_code == 401 and "not the admin key" in wrong.text
        assert "set-cookie" not in wrong.headers
        as_json = await client.post("/admin/ui/login", json={"key": ADMIN_KEY})
        assert as_json.status_code == 400
        forged = await client.get("/admin/ui", headers=_session("9999999999.deadbeef"))
        assert forged.status_code == 401

        ok = await client.post("/admin/ui/login", data={"key": ADMIN_KEY})
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
        out = await client.post("/admin/ui/logout", headers=_session(token))
        assert out.status_code == 303
        assert "max-age=0" in out.headers["set-cookie"].lower()
        # Ended server-side: the cookie a client kept is worth nothing now.
        assert (await client.get("/admin/ui", headers=_session(token))).status_code == 401


def _session(token: str) -> dict[str, str]:
    """The session cookie by hand: it is Secure, and httpx keeps those off plain http."""
    return {"cookie": f"sy_admin_session={token}"}


async def run_chromium(*args: str, timeout: float = 90) -> bytes:
    process = await asyncio.create_subprocess_exec(
        chromium_binary() or "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--virtual-time-budget=10000",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode == 0, stderr.decode()[-2000:]
    return stdout


@pytest.mark.skipif(
    chromium_binary() is None, reason="chromium is not installed (apt-get install chromium)"
)
async def test_dashboard_in_headless_chromium(
    dashboard_app: tuple[Starlette, list[UsageEvent]], reports: UsageReports, tmp_path: Path
) -> None:
    app, events = dashboard_app
    artifacts = REPO_ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    screenshot = artifacts / "dashboard.png"
    screenshot.unlink(missing_ok=True)
    async with serve(app) as base:
        profile = f"--user-data-dir={tmp_path / 'chromium'}"
        dom = (await run_chromium(profile, "--dump-dom", f"{base}/test-login")).decode()
        await run_chromium(
            profile, "--window-size=1600,2600", f"--screenshot={screenshot}", f"{base}/test-login"
        )

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

    for entry in KEY_LIST:
        row = numbers.key_rows[entry["id"]]
        assert row["data-status"] == entry["status"]
        assert (
            int(row["data-cost-nanos"]) == by_key.get(entry["id"], {"cost_nanos": 0})["cost_nanos"]
        )
    assert numbers.key_rows["key11"]["data-status"] == "unlisted"
    assert numbers.titles >= len(spend)  # every bar has its tooltip

    assert screenshot.exists() and screenshot.stat().st_size > 10_000
    print(f"\ndashboard screenshot: {screenshot}")
