"""Graceful shutdown: on SIGTERM the gateway drains before uvicorn stops it.

The order, which a load balancer and a Kubernetes rollout both rely on:

1. ``/readyz`` answers 503 (``draining``) so the replica leaves the endpoints.
2. New requests, also on kept-alive connections, get a 503 in OpenAI's envelope with
   ``Connection: close``; responses already running finish, and say ``Connection: close`` too.
3. When nothing is in flight, or ``shutdown_grace_s`` has passed, the signal goes on to uvicorn:
   it closes the listener and connections, then the app's lifespan flushes usage events and
   stops the embedded Redis.

``Drain`` is built by the app factory; ``DrainMiddleware`` counts requests (a streamed response
counts until its last byte) and refuses new ones once draining; ``sigterm_drain`` interposes the
drain between SIGTERM and whatever handler the server installed (uvicorn's ``handle_exit``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from gateway.errors import ServiceUnavailable

# Probes and scrapes keep answering while draining: they are how the outside sees the drain.
DRAIN_EXEMPT_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
_POLL_S = 0.05

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]


class Drain:
    """Whether the process is draining, and how many requests are in flight."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0
        self.refused = 0

    def begin(self) -> None:
        self.draining = True

    async def wait_idle(self, deadline_s: float) -> bool:
        """Wait until no request is in flight; False if the deadline came first."""
        give_up = time.monotonic() + deadline_s
        while self.in_flight > 0:
            if time.monotonic() >= give_up:
                return False
            await asyncio.sleep(_POLL_S)
        return True


def _refusal_body() -> bytes:
    error = ServiceUnavailable(
        "the gateway is shutting down; retry the request", code="shutting_down"
    )
    return error.body_bytes()


class DrainMiddleware:
    """Pure ASGI middleware: count requests in flight; refuse new ones while draining."""

    def __init__(self, app: Any, drain: Drain) -> None:
        self.app = app
        self.drain = drain
        self.refusal = _refusal_body()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        drain = self.drain
        if drain.draining and scope["path"] not in DRAIN_EXEMPT_PATHS:
            drain.refused += 1
            await self._refuse(scope, send)
            return

        async def send_closing(message: dict[str, Any]) -> None:
            # A response that starts while draining tells the client not to reuse the connection.
            if drain.draining and message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"connection", b"close")]
            await send(message)

        drain.in_flight += 1
        try:
            await self.app(scope, receive, send_closing)
        finally:
            drain.in_flight -= 1

    async def _refuse(self, scope: Scope, send: Send) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self.refusal)).encode()),
            (b"connection", b"close"),
            (b"retry-after", b"1"),
        ]
        for name, value in scope.get("headers", []):
            if name == b"x-request-id" and len(value) <= 200:
                headers.append((b"x-request-id", value))
                break
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": self.refusal})


@dataclass(eq=False)
class _SigtermRelay:
    """Replaces the server's SIGTERM handler: drain first, then hand the signal on."""

    drain: Drain
    grace_s: float
    log: Any
    loop: asyncio.AbstractEventLoop
    previous: Any  # the server's handler
    task: asyncio.Task[None] | None = field(default=None, init=False)

    def handle(self, sig: int, frame: FrameType | None) -> None:
        if self.drain.draining:  # a second SIGTERM: stop now
            self.hand_over(sig, frame)
            return
        # Signal handlers run between bytecodes; the loop's thread-safe entry point is the one
        # place that is safe to schedule from here.
        self.loop.call_soon_threadsafe(self._start, sig)

    def _start(self, sig: int) -> None:
        if self.drain.draining:
            return
        self.drain.begin()
        self.log.info("shutdown_draining", in_flight=self.drain.in_flight, grace_s=self.grace_s)
        self.task = self.loop.create_task(self._finish(sig))

    async def _finish(self, sig: int) -> None:
        idle = await self.drain.wait_idle(self.grace_s)
        self.log.info(
            "shutdown_drained" if idle else "shutdown_grace_expired",
            in_flight=self.drain.in_flight,
            refused=self.drain.refused,
        )
        self.hand_over(sig, None)

    def hand_over(self, sig: int, frame: FrameType | None) -> None:
        if callable(self.previous):
            self.previous(sig, frame)
            return
        # No server handler (plain default): restore it and deliver the signal for real.
        signal.signal(sig, self.previous if self.previous is not None else signal.SIG_DFL)
        signal.raise_signal(sig)


@contextlib.contextmanager
def sigterm_drain(drain: Drain, grace_s: float, log: Any) -> Iterator[None]:
    """While the app runs, SIGTERM drains it (only possible on the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # e.g. a server on a test thread: signals are not ours to take
        return
    previous = signal.getsignal(signal.SIGTERM)
    relay = _SigtermRelay(drain, grace_s, log, asyncio.get_running_loop(), previous)
    signal.signal(signal.SIGTERM, relay.handle)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) == relay.handle:
            signal.signal(signal.SIGTERM, previous)
