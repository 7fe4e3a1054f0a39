"""The access log and the request metrics carry the status the client actually got: a bug's
500, a client that left (499), Starlette's own 404/405, on /v1 and /admin alike;
written after the answer's last byte, never before it."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from gateway_runner import ADMIN_KEY, GatewayThread, RunningGateway, make_settings
from prometheus_client.parser import text_string_to_metric_families
from starlette.requests import Request

from gateway.server.exchange import ExchangeMiddleware, exchange_of

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def own_gateway(tmp_path_factory, fake_policy, redis_url) -> Iterator[RunningGateway]:
    """A gateway of this module's own: its faults are injected here and nowhere else."""
    runner = GatewayThread(make_settings(tmp_path_factory.mktemp("status"), fake_policy, redis_url))
    running = runner.start()
    try:
        yield running
    finally:
        runner.stop()


def _lines(gateway: RunningGateway, event: str, **match: Any) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 3
    while True:
        found = []
        for text in gateway.log.getvalue().splitlines():
            if not text.startswith("{"):
                continue
            line = json.loads(text)
            if line.get("event") == event and all(line.get(k) == v for k, v in match.items()):
                found.append(line)
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def requests_total(gateway: RunningGateway, route: str, status: int) -> float:
    text = httpx.get(gateway.base_url + "/metrics").text
    for family in text_string_to_metric_families(text):
        if family.name != "switchyard_requests":
            continue
        return sum(
            sample.value
            for sample in family.samples
            if sample.name == "switchyard_requests_total"
            and sample.labels["route"] == route
            and sample.labels["status"] == str(status)
        )
    return 0.0


def test_a_bug_in_a_v1_handler_is_a_500_everywhere(own_gateway: RunningGateway) -> None:
    _, key = own_gateway.create_key(name="status")
    services = own_gateway.services
    before = requests_total(own_gateway, "chat.completions", 500)

    def broken_plan(**kwargs: Any) -> Any:
        raise KeyError("secret internal detail")

    original = services.router.plan
    services.router.plan = broken_plan
    try:
        response = httpx.post(
            own_gateway.v1 + "/chat/completions",
            json={"model": "fake", "messages": HI},
            headers={"Authorization": f"Bearer {key}", "X-Request-ID": "bug-500"},
        )
    finally:
        services.router.plan = original
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "server_error"
    assert "secret internal detail" not in response.text and "Traceback" not in response.text
    assert response.headers["x-request-id"] == "bug-500"
    (line,) = _lines(own_gateway, "request", request_id="bug-500")
    assert line["status"] == 500 and line["error"] == "failed"
    (failure,) = _lines(own_gateway, "unhandled_error", request_id="bug-500")
    assert "KeyError" in failure["traceback"]
    assert requests_total(own_gateway, "chat.completions", 500) == before + 1


def test_a_client_that_leaves_mid_body_is_a_499(own_gateway: RunningGateway) -> None:
    _, key = own_gateway.create_key(name="leaver")
    with socket.create_connection(("127.0.0.1", int(own_gateway.base_url.rsplit(":", 1)[1]))) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-ID: gone-499\r\n"
            b"Authorization: Bearer " + key.encode() + b"\r\n"
            b"Content-Type: application/json\r\nContent-Length: 400\r\n\r\n"
            b'{"model": "fake", "messa'
        )
        time.sleep(0.2)
    (line,) = _lines(own_gateway, "request", request_id="gone-499")
    assert line["status"] == 499 and line["route"] == "chat.completions"


def test_starlette_errors_are_logged_and_counted(own_gateway: RunningGateway) -> None:
    before_404 = requests_total(own_gateway, "unmatched", 404)
    before_405 = requests_total(own_gateway, "/admin/keys/{key_id}", 405)
    missing = httpx.get(own_gateway.base_url + "/nothing/here", headers={"X-Request-ID": "nf-1"})
    assert missing.status_code == 404
    wrong = httpx.delete(own_gateway.base_url + "/admin/keys/abc", headers={"X-Request-ID": "wm-1"})
    assert wrong.status_code == 405
    (line,) = _lines(own_gateway, "request", request_id="nf-1")
    assert line["status"] == 404 and line["route"] == "unmatched"
    (line,) = _lines(own_gateway, "request", request_id="wm-1")
    assert line["status"] == 405 and line["route"] == "/admin/keys/{key_id}"
    assert requests_total(own_gateway, "unmatched", 404) == before_404 + 1
    assert requests_total(own_gateway, "/admin/keys/{key_id}", 405) == before_405 + 1


def test_a_bug_in_an_admin_handler_is_logged_as_500(own_gateway: RunningGateway) -> None:
    keys = own_gateway.services.keys

    async def broken_list(**kwargs: Any) -> Any:
        raise ZeroDivisionError("secret")

    original = keys.list
    keys.list = broken_list
    try:
        response = httpx.get(
            own_gateway.base_url + "/admin/keys",
            headers={"Authorization": f"Bearer {ADMIN_KEY}", "X-Request-ID": "admin-500"},
        )
    finally:
        keys.list = original
    assert response.status_code == 500 and "secret" not in response.text
    (line,) = _lines(own_gateway, "admin_request", request_id="admin-500")
    assert line["status"] == 500


async def _exchange_events(*, client_gone: bool) -> list[Any]:
    """What the client was sent and when the access line was written, in order, for an app
    that registers its line and answers with a two-piece body."""
    events: list[Any] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        exchange = exchange_of(Request(scope))
        assert exchange is not None
        exchange.on_end(lambda status: events.append(("line", status)))
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b"})

    async def send(message: dict[str, Any]) -> None:
        if client_gone and message.get("body") == b"b":
            raise OSError("the client is gone")
        events.append(message.get("body", message.get("status")))

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "method": "GET", "path": "/x", "headers": []}
    with pytest.raises(OSError) if client_gone else contextlib.nullcontext():
        await ExchangeMiddleware(app)(scope, receive, send)
    return events


async def test_the_access_line_follows_the_last_byte() -> None:
    # The client never waits for the line; the line still comes once, with the status sent.
    assert await _exchange_events(client_gone=False) == [201, b"a", b"b", ("line", 201)]


async def test_a_last_byte_that_cannot_be_sent_still_ends_with_one_line() -> None:
    assert await _exchange_events(client_gone=True) == [201, b"a", ("line", 201)]
