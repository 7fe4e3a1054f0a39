"""What the request pipeline calls to trace a request, and the do-nothing version of it.

One ``RequestTrace`` per /v1 request (``Tracing.start_request``, which honours an incoming
W3C ``traceparent``), with children: ``stage(name)`` for the steps of the pipeline
(``authenticate``, ``limits``, ``cache``, ``usage_record``...), ``attempt(...)`` for each try
of an upstream (retries and fallbacks each get one: number, provider, model, outcome), whose
``inject`` writes the ``traceparent`` of that try into the upstream request's headers and whose
``engine_phases`` adds the local engine's queue / prefill / decode as span events.

When tracing is off, ``NoTracing`` hands out ``NO_REQUEST``, one shared object whose methods
do nothing and whose stages are one shared context manager: a request allocates nothing and
pays a few attribute look-ups and calls (``python -m bench.tracing`` measures it).
These objects hold no state, so sharing them across requests is safe.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(slots=True)
class EnginePhases:
    """A local engine request's timeline, in ``time.monotonic()`` seconds (the engine's clock);
    a phase that never began is None. The local provider fills one in as the request runs and
    hands out copies."""

    queued_at: float
    scheduled_at: float | None = None  # the first step that computed it: prefill began
    first_token_at: float | None = None  # prefill done: decode began
    finished_at: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None


class Stage(Protocol):
    def __enter__(self) -> Stage: ...

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> bool | None: ...

    def set(self, name: str, value: Any) -> None:
        """One attribute on the stage's span (e.g. the cache outcome)."""


class AttemptTrace(Protocol):
    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Write this try's ``traceparent`` (and ``tracestate``) into upstream headers."""

    def engine_phases(self, phases: EnginePhases) -> None:
        """The local engine's queue, prefill and decode, as span events."""

    def end(
        self, outcome: str, *, status: int | None = None, error_type: str | None = None
    ) -> None:
        """``outcome``: ok, failed, skipped, timeout... (the dispatcher's words)."""


class RequestTrace(Protocol):
    def stage(self, name: str) -> Stage: ...

    def request(self, route: str, body: Mapping[str, Any]) -> None:
        """The request's ``gen_ai.request.*`` attributes (and its messages, if captured)."""

    def set(self, name: str, value: Any) -> None:
        """One attribute on the request span (task, strategy, cache outcome, key id...)."""

    def attempt(
        self, *, number: int, provider: str, model: str, upstream_model: str, local: bool = False
    ) -> AttemptTrace: ...

    def observe_response(self, data: Any) -> None:
        """A JSON answer: response id, model, finish reasons, usage."""

    def observe_chunk(self, chunk: Any) -> None:
        """One parsed stream chunk (same facts, gathered as they stream)."""

    def end(self, status: int, *, error_type: str | None = None) -> None:
        """The request is over (the status that went out); exports the span."""


class Tracing(Protocol):
    enabled: bool
    reason: str

    def start_request(
        self, *, route: str, method: str, path: str, headers: Mapping[str, str]
    ) -> RequestTrace: ...

    async def aclose(self) -> None:
        """Flush what is buffered and stop exporting (off the event loop)."""


class _NoStage:
    __slots__ = ()

    def __enter__(self) -> _NoStage:
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        return None

    def set(self, name: str, value: Any) -> None:
        pass


class _NoAttempt:
    __slots__ = ()

    def inject(self, headers: MutableMapping[str, str]) -> None:
        pass

    def engine_phases(self, phases: EnginePhases) -> None:
        pass

    def end(
        self, outcome: str, *, status: int | None = None, error_type: str | None = None
    ) -> None:
        pass


NO_STAGE = _NoStage()
NO_ATTEMPT = _NoAttempt()


class _NoRequest:
    __slots__ = ()

    def stage(self, name: str) -> _NoStage:
        return NO_STAGE

    def request(self, route: str, body: Mapping[str, Any]) -> None:
        pass

    def set(self, name: str, value: Any) -> None:
        pass

    def attempt(
        self, *, number: int, provider: str, model: str, upstream_model: str, local: bool = False
    ) -> _NoAttempt:
        return NO_ATTEMPT

    def observe_response(self, data: Any) -> None:
        pass

    def observe_chunk(self, chunk: Any) -> None:
        pass

    def end(self, status: int, *, error_type: str | None = None) -> None:
        pass


NO_REQUEST = _NoRequest()


class NoTracing:
    """Tracing off: every request gets ``NO_REQUEST``."""

    __slots__ = ("reason",)
    enabled = False

    def __init__(self, reason: str = "off") -> None:
        self.reason = reason

    def start_request(
        self, *, route: str, method: str, path: str, headers: Mapping[str, str]
    ) -> _NoRequest:
        return NO_REQUEST

    async def aclose(self) -> None:
        pass
