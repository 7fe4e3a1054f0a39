"""A client that leaves before the first chunk of a stream: the relay never starts, yet the
provider slot, the breaker's half-open probe and the usage record must not leak.

uvicorn speaks ASGI 2.3, where the response watches for ``http.disconnect`` beside the sender
and cancels the sender; the body generator is then never started and its ``finally`` never
runs. The app is driven here in-process with exactly that: a disconnect waiting in ``receive``
and a slow socket in ``send``. Also here: the body is sent from the response's own task, and a
client gone mid-stream is told from a cancel that comes from elsewhere."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from fake_provider import FakeProviderFleet
from gateway_runner import make_settings
from route_rig import base_policy
from starlette.requests import ClientDisconnect

from gateway.api.v1.request_end import ClosingStreamingResponse
from gateway.app import create_app
from gateway.settings import BreakerSettings


async def test_the_body_ends_when_it_never_relayed() -> None:
    events: list[str] = []

    async def body() -> Any:
        try:
            yield b""  # taken when the response is made
            events.append("relay started")
            yield b"data: x\n\n"
        finally:
            events.append("ended")

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def slow_send(message: dict[str, Any]) -> None:
        await asyncio.sleep(0.2)

    response = await ClosingStreamingResponse.started(body())
    await response({"type": "http", "asgi": {"spec_version": "2.3"}}, receive, slow_send)
    assert events == ["ended"]


SCOPE = {"type": "http", "asgi": {"spec_version": "2.3"}}


async def client_stays() -> dict[str, Any]:
    """A ``receive`` whose client never leaves."""
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


def bodies(sent: list[dict[str, Any]]) -> list[bytes]:
    return [m["body"] for m in sent if m["type"] == "http.response.body"]


async def test_the_body_is_sent_from_the_responses_own_task() -> None:
    """No task between the response and its first byte: on a busy loop a new task's first
    step waits for a round of every other request's work."""
    relaying: list[asyncio.Task[Any] | None] = []

    async def body() -> Any:
        yield b""
        relaying.append(asyncio.current_task())
        yield b"data: x\n\n"

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    response = await ClosingStreamingResponse.started(body())
    await response(SCOPE, client_stays, send)
    assert relaying == [asyncio.current_task()]
    assert bodies(sent) == [b"data: x\n\n", b""]


async def test_a_client_gone_mid_stream_ends_the_relay_quietly() -> None:
    events: list[str] = []
    first_sent = asyncio.Event()

    async def body() -> Any:
        try:
            yield b""
            yield b"data: 1\n\n"
            await asyncio.sleep(10)  # the upstream's next event, which never comes
            yield b"data: 2\n\n"
        finally:
            events.append("ended")

    async def receive() -> dict[str, Any]:
        await first_sent.wait()
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message.get("body"):
            first_sent.set()

    response = await ClosingStreamingResponse.started(body())
    async with asyncio.timeout(5):
        await response(SCOPE, receive, send)  # returns: the client's leaving is no error
    assert events == ["ended"]
    assert bodies(sent) == [b"data: 1\n\n"]


async def test_a_send_that_fails_as_the_client_left_is_a_client_disconnect() -> None:
    """ASGI 2.4 servers raise ``OSError`` from ``send`` once the client is gone."""
    events: list[str] = []

    async def body() -> Any:
        try:
            yield b""
            yield b"data: 1\n\n"
        finally:
            events.append("ended")

    async def send(message: dict[str, Any]) -> None:
        raise OSError("connection reset")

    response = await ClosingStreamingResponse.started(body())
    with pytest.raises(ClientDisconnect):
        await response({"type": "http", "asgi": {"spec_version": "2.4"}}, client_stays, send)
    assert events == ["ended"]


async def test_a_cancel_from_elsewhere_still_cancels_the_response() -> None:
    """The server stopping cancels the request's task: that is not a client gone."""
    events: list[str] = []
    relaying = asyncio.Event()

    async def body() -> Any:
        try:
            yield b""
            relaying.set()
            await asyncio.sleep(10)
            yield b"data: never\n\n"
        finally:
            events.append("ended")

    async def send(message: dict[str, Any]) -> None:
        pass

    response = await ClosingStreamingResponse.started(body())
    task = asyncio.ensure_future(response(SCOPE, client_stays, send))
    await relaying.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert events == ["ended"]


async def left_before_the_first_chunk(
    app: Any, lifespan_state: dict[str, Any], key: str
) -> list[dict[str, Any]]:
    """POST a streamed chat; the client is gone before the response starts. Returns what was
    sent (nothing, as the socket never took the response head). ``lifespan_state`` is what the
    app's lifespan yielded: a server copies it into every request's scope."""
    request = orjson.dumps(
        {"model": "m-alpha", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    )
    incoming = [
        {"type": "http.request", "body": request, "more_body": False},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await asyncio.sleep(0.3)  # a slow socket: the disconnect wins the race
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"test"),
            (b"authorization", f"Bearer {key}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(request)).encode()),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80),
        "state": dict(lifespan_state),
    }
    await app(scope, receive, send)
    return sent


async def test_a_probe_whose_client_left_early_frees_slot_probe_and_records_usage(
    tmp_path: Path, fleet: FakeProviderFleet, redis_url: str
) -> None:
    fleet.reset()
    policy_path = tmp_path / "routing_rules.yaml"
    policy_path.write_text(yaml.safe_dump(base_policy(fleet), sort_keys=False))
    log = io.BytesIO()  # the JSON logger writes bytes, flushed when the lifespan ends
    app = create_app(make_settings(tmp_path, policy_path, redis_url), log_stream=log)
    async with app.router.lifespan_context(app) as lifespan_state:
        services = lifespan_state["services"]
        state = services.router.state
        state.breakers.reset(BreakerSettings(consecutive_failures=1, cooldown_s=0.05))
        breaker = state.breakers.get("alpha", "m-alpha")
        breaker.record_failure()
        await asyncio.sleep(0.1)
        assert breaker.state == "half_open"
        key = (await services.keys.create({"name": "early-leaver"})).key

        assert await left_before_the_first_chunk(app, lifespan_state, key) == []
        assert fleet["alpha"].hit_count() == 1  # the probe went out and its stream opened
        assert state.inflight.count("alpha") == 0
        assert breaker.state == "half_open" and breaker.would_allow()  # no verdict, probe free
    lines = [json.loads(line) for line in log.getvalue().splitlines() if line]
    requests = [line for line in lines if line.get("event") == "request"]
    assert len(requests) == 1
    assert requests[0]["status"] == 499 and requests[0]["usage_id"]
    assert requests[0]["provider"] == "alpha"
