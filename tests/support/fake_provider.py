"""Loopback OpenAI-compatible providers that fail on cue, for end-to-end tests of the gateway.

Each ``FakeProvider`` is a real aiohttp server on 127.0.0.1 answering ``/v1/chat/completions``
(JSON or SSE stream). A test tells it how to behave with ``play(*steps, then=...)``: every
request takes the next step, and once the steps are used up every request gets ``then``.

Steps (``Step`` or a shorthand string):

- ``"ok"``                 a normal answer naming the provider;
- ``Step("status", 500)``  that status with an OpenAI error envelope;
- ``Step("retry_after", s)`` a 429 with ``Retry-After: s``;
- ``Step("hang", s)``      no response for ``s`` seconds (then a normal one): a timeout;
- ``"reset"``              the connection is dropped without a response;
- ``Step("slow", s)``      a normal answer whose first byte comes after ``s`` seconds;
- ``"cut"``                a stream cut after its first chunk (JSON requests: like ``reset``).

All providers of a ``FakeProviderFleet`` run on one background thread with its own event loop,
so that tests may call the gateway with the synchronous openai SDK as well as the async one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from chat_answers import chat_chunk, chat_completion
from loopback import LoopbackFleet, LoopbackServer

PROMPT_TOKENS = 10
COMPLETION_TOKENS = 5


@dataclass(frozen=True)
class Step:
    kind: str  # ok | status | retry_after | hang | reset | slow | cut
    arg: float = 0.0


OK = Step("ok")
RESET = Step("reset")
CUT = Step("cut")


def _as_step(step: Step | str) -> Step:
    if isinstance(step, Step):
        return step
    if step in ("ok", "reset", "cut"):
        return Step(step)
    raise ValueError(f"unknown shorthand step {step!r} (use Step(kind, arg))")


@dataclass(frozen=True)
class Hit:
    at: float  # time.monotonic() when the request arrived
    model: str
    stream: bool
    step: Step
    traceparent: str | None = None  # the W3C trace context the gateway sent


class FakeProvider(LoopbackServer):
    """One scripted upstream; its methods are safe to call from the test thread."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self._lock = threading.Lock()
        self._steps: deque[Step] = deque()
        self._then: Step = OK
        self._hits: list[Hit] = []

    # -- test-facing controls ---------------------------------------------------------------

    def play(self, *steps: Step | str, then: Step | str = OK) -> None:
        """Replace the script: ``steps`` once each, then ``then`` for every later request."""
        with self._lock:
            self._steps = deque(_as_step(s) for s in steps)
            self._then = _as_step(then)

    @property
    def hits(self) -> list[Hit]:
        with self._lock:
            return list(self._hits)

    def hit_count(self) -> int:
        with self._lock:
            return len(self._hits)

    def clear_hits(self) -> None:
        with self._lock:
            self._hits.clear()

    # -- server -----------------------------------------------------------------------------

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._handle)

    def _next_step(self, model: str, stream: bool, traceparent: str | None = None) -> Step:
        with self._lock:
            step = self._steps.popleft() if self._steps else self._then
            self._hits.append(Hit(time.monotonic(), model, stream, step, traceparent))
            return step

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        model = str(body.get("model", ""))
        stream = body.get("stream") is True
        step = self._next_step(model, stream, request.headers.get("traceparent"))
        if step.kind == "status":
            code = int(step.arg)
            error = {"message": f"{self.name} failed with {code}", "type": "server_error"}
            return web.json_response({"error": error}, status=code)
        if step.kind == "retry_after":
            error = {"message": f"{self.name} is rate limited", "type": "rate_limit_error"}
            return web.json_response(
                {"error": error}, status=429, headers={"Retry-After": f"{step.arg:g}"}
            )
        if step.kind == "reset" or (step.kind == "cut" and not stream):
            assert request.transport is not None
            request.transport.abort()
            raise web.HTTPInternalServerError()  # never sent: the connection is gone
        if step.kind in ("hang", "slow"):
            await asyncio.sleep(step.arg)
        if stream:
            return await self._stream(request, body, model, cut=step.kind == "cut")
        answer = chat_completion(
            self.name, model, f"served by {self.name}", _usage(), created=int(time.time())
        )
        return web.json_response(answer)

    async def _stream(
        self, request: web.Request, body: dict[str, Any], model: str, *, cut: bool = False
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        created = int(time.time())
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return chat_chunk(self.name, model, delta, finish, created=created)

        events = [
            chunk({"role": "assistant", "content": "served"}, None),
            chunk({"content": f" by {self.name}"}, None),
            chunk({}, "stop"),
        ]
        if include_usage:
            events.append({**chunk({}, None), "choices": [], "usage": _usage()})
        for event in events:
            await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
            if cut:
                assert request.transport is not None
                request.transport.abort()
                return response
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _usage() -> dict[str, int]:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": COMPLETION_TOKENS,
        "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
    }


class FakeProviderFleet(LoopbackFleet[FakeProvider]):
    """A ``FakeProvider`` of each name on one background event loop; a context manager."""

    def __init__(self, *names: str) -> None:
        super().__init__(FakeProvider(name) for name in names)

    @property
    def providers(self) -> dict[str, FakeProvider]:
        return self.servers

    def reset(self) -> None:
        """Every provider back to answering ``ok``, hit lists emptied."""
        for provider in self.servers.values():
            provider.play()
            provider.clear_hits()
