"""Days at the calendar's edges and forged cursors, at every admin and dashboard entry point:
each is a 400 naming the parameter (a page with ``data-param`` on the dashboard), never a 500
(the OverflowError of issue 26) nor a 503 that blames the store; and a forged cursor is
refused before it reaches the store, SQLite and PostgreSQL alike."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import pytest
from dashboard_client import login, session_headers
from gateway_runner import ADMIN_KEY, RunningGateway

from gateway.ledger import EventQuery, LedgerQueryError, open_store
from gateway.ledger.audit import AuditQuery, AuditQueryError
from gateway.ledger.backends import open_audit_store
from gateway.metering.reports import ReportError, UsageReports

EDGES = ["9999-12-31", "0001-01-01"]
API_URLS = [
    ("/admin/audit", {"to": "9999-12-31"}, "to"),
    ("/admin/audit", {"from": "0001-01-01"}, "from"),
    ("/admin/audit", {"from": "9999-12-31", "format": "csv"}, "from"),
    ("/admin/usage", {"from": "9999-12-31", "to": "9999-12-31"}, "from"),
    ("/admin/usage", {"from": "9999-12-31", "to": "9999-12-31", "format": "csv"}, "from"),
    ("/admin/usage", {"to": "9999-12-31"}, "to"),
    ("/admin/usage", {"to": "0001-01-01"}, "to"),
]
PAGE_URLS = [
    ("/admin/ui", {"to": "9999-12-31"}, "to"),
    ("/admin/ui", {"to": "0001-01-01"}, "to"),
    ("/admin/ui", {"from": "0001-01-01", "to": "0001-01-02"}, "from"),
    ("/admin/ui/audit", {"to": "9999-12-31"}, "to"),
    ("/admin/ui/audit", {"from": "0001-01-01"}, "from"),
]


def _cursor(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# Base64 of what a server could never have written: a time past any stored row (the day of it
# overflows the calendar), a negative one, a NUL in the id (PostgreSQL text cannot hold it),
# no id, and bytes that are not text.
FORGED = [
    _cursor(b"99999999999999999999|x"),
    _cursor(b"253402300800000|x"),
    _cursor(b"-1|x"),
    _cursor(b"1796000000000|a\x00b"),
    _cursor(b"1796000000000|"),
    _cursor(b"\xff\xfe|x"),
    "not base64 at all!",
]


@pytest.mark.parametrize(("path", "params", "param"), API_URLS)
def test_an_edge_day_on_the_admin_api_is_a_400_naming_it(
    gateway: RunningGateway, path: str, params: dict, param: str
) -> None:
    with gateway.admin() as admin:
        response = admin.get(path, params=params)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize(("path", "params", "param"), PAGE_URLS)
def test_an_edge_day_on_the_dashboard_is_a_400_page_naming_it(
    gateway: RunningGateway, path: str, params: dict, param: str
) -> None:
    with httpx.Client(base_url=gateway.base_url, timeout=30) as browser:
        token = login(browser, ADMIN_KEY).cookies["sy_admin_session"]
        page = browser.get(path, params=params, headers=session_headers(token))
    assert page.status_code == 400, page.text[:500]
    if path == "/admin/ui":  # the audit page names no field, it says the filter is wrong
        assert f'data-param="{param}"' in page.text


def test_the_last_and_first_days_the_ledger_holds_still_answer(gateway: RunningGateway) -> None:
    with gateway.admin() as admin:
        for params in ({"from": "5138-11-01", "to": "5138-11-16"}, {"to": "1970-01-01"}):
            report = admin.get("/admin/usage", params=params)
            assert report.status_code == 200, report.text
            assert report.json()["totals"]["requests"] == 0
        assert admin.get("/admin/audit", params={"to": "5138-11-16"}).status_code == 200


@pytest.mark.parametrize("cursor", FORGED)
def test_a_forged_cursor_is_a_400_on_the_events_and_the_audit_log(
    gateway: RunningGateway, cursor: str
) -> None:
    with gateway.admin() as admin:
        for path in ("/admin/usage/events", "/admin/audit"):
            response = admin.get(path, params={"cursor": cursor})
            assert response.status_code == 400, (path, response.text)
            assert response.json()["error"]["param"] == "cursor"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'usage.sqlite3'}"
    return request.getfixturevalue("postgres_url")


async def test_a_forged_cursor_never_reaches_either_store(store_url: str, tmp_path: Path) -> None:
    store = await open_store(store_url, data_dir=tmp_path)
    audit = await open_audit_store(store_url, data_dir=tmp_path)
    try:
        reports = UsageReports(store)
        for cursor in FORGED:
            with pytest.raises(ReportError) as refused:
                await reports.events(cursor=cursor)
            assert refused.value.param == "cursor"
            with pytest.raises(LedgerQueryError):
                EventQuery(cursor=cursor)
            with pytest.raises(AuditQueryError):
                AuditQuery(cursor=cursor)
        # A real cursor still pages on in both.
        page = await store.list_events(EventQuery(cursor=_cursor(b"1796000000000|abc")))
        assert page.events == []
        assert (await audit.query(AuditQuery(cursor=_cursor(b"1796000000000|abc")))).entries == []
    finally:
        await audit.close()
        await store.close()
