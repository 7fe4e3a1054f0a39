"""Runs a route plan: retries, fallbacks, circuit breakers and per-provider concurrency.

``Dispatcher.run(plan, attempt)`` calls ``attempt(candidate)`` (an ``Attempt``: the
provider-side object of ``providers/attempt.py`` that does the upstream call up to the point
where the first byte would go to the client, raising ``UpstreamError``) for each candidate in
order until one succeeds:

- retryable errors (connect, timeout, 429, 5xx) are retried with exponential backoff and
  jitter, or exactly the upstream's Retry-After, while the total time budget lasts; a
  Retry-After longer than ``max_retry_after_s`` or the time left moves on at once;
- an upstream 401/403 (a 502 ``upstream_auth_failed`` by then: our key is wrong there), a 404
  (our model name is wrong there) and a missing API key are configuration errors of that
  candidate: no retry, next candidate;
- only failures that say the provider is broken for every tenant count against its breaker
  (``routing/fault.py``: no answer, 5xx, 408/429, 401); what a client can cause by what it
  sends (other 4xx, 403, 404) does not;
- any other 4xx is the client's fault: it is raised at once (no retry, no fallback), as is an
  error marked ``final`` (an upload already streamed to the candidate cannot be sent again);
- a candidate whose breaker is open (or half-open with its probe out), or whose provider is at
  ``max_concurrency``, is skipped;
- a candidate whose ``context_window`` the prompt's estimate cannot fit is skipped (kind
  ``context_window``); when every candidate is skipped so, the request is a 400
  ``context_length_exceeded``;
- an upstream error whose code the task lists in ``fallback_on`` (``context_length_exceeded``,
  ``content_filter``: client errors otherwise) moves on to the next candidate;
- an operation a provider does not offer, or a request it cannot be translated for (kind
  ``unsupported`` / ``untranslatable``, a 400), moves on to the next candidate;
- a candidate whose provider says it cannot take a request now (``unavailable()``: a local
  engine that is not loaded or unhealthy) is skipped; one that is only busy (a local engine
  past its ``spill_when`` thresholds) spills to the next candidates (the served one is marked
  ``spilled``), and is still tried last when none of those serves.

Every try and skip is recorded in ``attempts`` for usage, explain and logs.

A plain call's outcome is known when ``attempt`` returns. A held one (``hold=True``, a stream
still flowing) is judged when it ends: the caller reports ``result.succeeded()`` (clean end) or
``result.failed()`` (cut after the first byte), and only then do the breaker and the latency
average hear of it; ``result.release()`` alone (the client went away) counts neither way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential_jitter

from gateway.errors import UpstreamError
from gateway.formats.errors import CONTEXT_LENGTH_EXCEEDED
from gateway.policy import Candidate, ProviderConfig
from gateway.providers.base import Unavailable
from gateway.providers.registry import ProviderRegistry
from gateway.redact import redact
from gateway.routing.breaker import CircuitBreaker
from gateway.routing.fault import counts_against_breaker
from gateway.routing.router import RoutePlan
from gateway.routing.state import RoutingState
from gateway.settings import RetrySettings

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

# Configuration errors of a candidate: the next one is tried. They need not count against its
# breaker (a 403 or 404 can follow from what the client sent: routing/fault.py).
CONFIG_STATUSES = frozenset({401, 403, 404})


class Attempt(Protocol[T_co]):
    """One try of a request at ``candidate``, up to its first byte for the client."""

    async def __call__(self, candidate: Candidate) -> T_co: ...


@dataclass
class AttemptRecord:
    model: str
    provider: str
    outcome: str  # ok | failed | skipped
    detail: str = ""
    status: int | None = None
    kind: str | None = None
    duration_s: float = 0.0
    retry_in_s: float | None = None  # the wait before the next try of this candidate

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "provider": self.provider,
            "outcome": self.outcome,
            "detail": self.detail,
            "status": self.status,
            "kind": self.kind,
            "duration_s": round(self.duration_s, 6),
            "retry_in_s": self.retry_in_s,
        }


@dataclass(eq=False)
class HeldCall:
    """A call that reached the upstream, held until it ends: breaker, latency and provider slot
    are settled exactly once, by whichever of ``succeeded``/``failed``/``release`` comes first."""

    state: RoutingState
    candidate: Candidate
    breaker: CircuitBreaker
    probe: bool = field(kw_only=True)  # this call holds the half-open breaker's one probe slot
    # Set when the attempt returns: what the latency EWMA learns.
    first_byte_s: float = field(default=0.0, init=False)
    _open: bool = field(default=True, init=False, repr=False)

    def succeeded(self) -> None:
        if self._settle():
            self.breaker.record_success()
            self.state.latency.observe(self.candidate.model, self.first_byte_s)

    def failed(self, counts: bool = True) -> None:
        """``counts=False``: the failure says nothing about the upstream's health."""
        if self._settle():
            if counts:
                self.breaker.record_failure()
            elif self.probe:
                self.breaker.release_probe()

    def release(self) -> None:
        if self._settle() and self.probe:
            self.breaker.release_probe()

    def _settle(self) -> bool:
        if not self._open:
            return False
        self._open = False
        self.state.inflight.release(self.candidate.provider)
        return True


@dataclass
class DispatchResult(Generic[T]):
    value: T
    candidate: Candidate
    attempts: list[AttemptRecord]
    _held: HeldCall | None = field(default=None, repr=False)

    def succeeded(self) -> None:
        """A held stream ended cleanly: a success for the breaker, its time to first byte for
        the latency average; the provider slot is given back. Idempotent."""
        if self._held is not None:
            self._held.succeeded()

    def failed(self) -> None:
        """A held stream was cut after its first byte: a failure for the breaker (both its
        rules); the provider slot is given back. Idempotent."""
        if self._held is not None:
            self._held.failed()

    def release(self) -> None:
        """Give the provider slot back without a verdict (the client went away). Idempotent,
        and a no-op after ``succeeded``/``failed``; with ``hold=False`` every call is a no-op."""
        if self._held is not None:
            self._held.release()


class DispatchFailed(UpstreamError):
    """No candidate served. Status, message and upstream body come from the deciding error."""

    def __init__(self, message: str, attempts: list[AttemptRecord], **kwargs: Any) -> None:
        kwargs.setdefault("retryable", False)
        super().__init__(message, **kwargs)
        self.attempts = attempts

    @classmethod
    def from_error(cls, error: UpstreamError, attempts: list[AttemptRecord]) -> DispatchFailed:
        failed = cls(
            error.message,
            attempts,
            status=error.status,
            kind=error.kind,
            provider=error.provider,
            upstream_body=error.upstream_body,
            retry_after_s=error.retry_after_s,
            code=error.code,
            param=error.param,
            error_type=error.type,
            headers=error.headers,
        )
        failed.__cause__ = error
        return failed

    @classmethod
    def all_skipped(cls, attempts: list[AttemptRecord]) -> DispatchFailed:
        """No candidate was tried (each one's reason is in the message). Only the prompt's
        length in the way of every candidate is the client's to fix: a 400; else a 503."""
        reasons = "; ".join(f"{a.model}: {a.detail}" for a in attempts)
        if attempts and all(a.kind == "context_window" for a in attempts):
            return cls(
                f"the prompt is too long for every candidate's context window ({reasons})",
                attempts,
                status=400,
                kind="status",
                code=CONTEXT_LENGTH_EXCEEDED,
                error_type="invalid_request_error",
            )
        return cls(
            f"no upstream can take this request now (all candidates skipped: {reasons})",
            attempts,
            status=503,
            kind="unavailable",
            code="no_healthy_upstream",
        )


class _Skipped(Exception):
    """The candidate was not tried (breaker open, provider full); not retried."""


def is_client_error(error: UpstreamError) -> bool:
    return (
        not error.retryable
        and error.kind == "status"
        and 400 <= error.status < 500
        and error.status not in CONFIG_STATUSES
    )


class Dispatcher:
    def __init__(
        self,
        state: RoutingState,
        settings: RetrySettings | None = None,
        *,
        env: Mapping[str, str] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        providers: ProviderRegistry | None = None,
    ) -> None:
        self.state = state
        self._providers = providers
        self.settings = settings or RetrySettings()
        self._env = env if env is not None else os.environ
        self._sleep = sleep
        self._clock = clock
        self._log = structlog.get_logger("switchyard.dispatch")
        self._backoff = wait_exponential_jitter(
            initial=self.settings.initial_backoff_s,
            max=self.settings.max_backoff_s,
            jitter=self.settings.jitter_s,
        )

    async def run(
        self,
        plan: RoutePlan,
        attempt: Attempt[T],
        *,
        hold: bool = False,
    ) -> DispatchResult[T]:
        """Serve ``plan`` with ``attempt``; raise ``DispatchFailed`` when nothing served.

        With ``hold=True`` the provider slot stays taken after the return (a stream still
        flowing) and the call is not yet judged: the caller must end it with
        ``result.succeeded()``, ``result.failed()`` or ``result.release()``.
        """
        attempts: list[AttemptRecord] = []
        deadline = self._clock() + self.settings.total_budget_s
        last_error: UpstreamError | None = None
        queue = [(candidate, True) for candidate in plan.candidates]
        spilled: list[Candidate] = []  # candidates too busy: tried again last
        position = 0
        while True:
            if position == len(queue):
                if not spilled or not queue[-1][1]:
                    break
                queue.extend((candidate, False) for candidate in spilled)
            candidate, ask_provider = queue[position]
            position += 1
            too_long = plan.too_long_for(candidate)
            if too_long is not None:
                attempts.append(
                    AttemptRecord(
                        candidate.model,
                        candidate.provider,
                        "skipped",
                        too_long,
                        kind="context_window",
                    )
                )
                continue
            provider = self._provider(plan, candidate)
            unavailable = self._unavailable(candidate, provider) if ask_provider else None
            if unavailable is not None:
                attempts.append(
                    AttemptRecord(
                        candidate.model,
                        candidate.provider,
                        "skipped",
                        unavailable.detail,
                        kind="spill" if unavailable.spill else "unavailable",
                    )
                )
                if unavailable.spill:
                    spilled.append(candidate)
                continue
            missing = self._missing_env(provider)
            if missing:
                missing_key, holds = missing
                attempts.append(
                    AttemptRecord(
                        candidate.model,
                        candidate.provider,
                        "skipped",
                        f"missing {holds}: {missing_key} is not set",
                        kind="config",
                    )
                )
                last_error = UpstreamError(
                    f"provider {candidate.provider} has no {holds} ({missing_key} is not set)",
                    status=503,
                    retryable=False,
                    kind="config",
                    provider=candidate.provider,
                    code="upstream_not_configured",
                )
                continue
            if self._clock() >= deadline:
                attempts.append(
                    AttemptRecord(
                        candidate.model, candidate.provider, "skipped", "time budget spent"
                    )
                )
                continue
            try:
                value, held = await self._serve(
                    candidate, provider, attempt, attempts, deadline, hold
                )
            except _Skipped:
                continue
            except UpstreamError as error:
                if error.final or (is_client_error(error) and error.code not in plan.fallback_on):
                    raise DispatchFailed.from_error(error, attempts) from error
                last_error = error
                continue
            if spilled and ask_provider:  # served here because a busier candidate spilled
                candidate = dataclasses.replace(candidate, spilled=True)
            return DispatchResult(value, candidate, attempts, held)
        if last_error is None:
            raise DispatchFailed.all_skipped(attempts)
        raise DispatchFailed.from_error(last_error, attempts) from last_error

    async def dispatch(self, plan: RoutePlan, attempt: Attempt[T]) -> tuple[Candidate, T]:
        """``run`` in the shape of ``providers.first_candidate.Dispatch``: (served, value)."""
        result = await self.run(plan, attempt)
        return result.candidate, result.value

    def preview(self, plan: RoutePlan) -> list[dict[str, Any]]:
        """What ``run`` would do with each candidate right now, without calling anything."""
        rows = []
        for candidate in plan.candidates:
            provider = self._provider(plan, candidate)
            state = self.state.breakers.state_of(candidate.provider, candidate.model)
            limit = provider.max_concurrency if provider else None
            inflight = self.state.inflight.count(candidate.provider)
            missing = self._missing_env(provider)
            unavailable = self._unavailable(candidate, provider)
            too_long = plan.too_long_for(candidate)
            if too_long is not None:
                verdict = f"skipped: {too_long}"
            elif unavailable is not None:
                verdict = f"skipped: {unavailable.detail}"
            elif missing:
                verdict = f"skipped: missing {missing[1]} ({missing[0]} is not set)"
            elif state == "open":
                verdict = "skipped: breaker open"
            elif not self.state.breakers.would_allow(candidate.provider, candidate.model):
                verdict = "skipped: breaker half_open (probe in flight)"
            elif limit is not None and inflight >= limit:
                verdict = f"skipped: provider at max_concurrency ({limit})"
            else:
                verdict = "would try" if state == "closed" else "would try (half-open probe)"
            rows.append(
                {
                    "model": candidate.model,
                    "provider": candidate.provider,
                    "breaker": state,
                    "inflight": inflight,
                    "max_concurrency": limit,
                    "latency_ewma_s": self.state.latency.estimate(candidate.model),
                    "verdict": verdict,
                }
            )
        return rows

    def not_servable(self, provider: str, config: ProviderConfig) -> str | None:
        """Why ``provider`` cannot serve at all now (its key unset, its engine not loaded...);
        None when it can. Busy (past ``spill_when``) or a breaker open is not a reason: those
        pass."""
        missing = self._missing_env(config)
        if missing:
            return f"{missing[0]} is not set"
        if self._providers is None:
            return None
        try:
            unavailable = self._providers.get(provider, config).unavailable()
        except UpstreamError as error:
            return error.message
        if unavailable is not None and not unavailable.spill:
            return unavailable.detail
        return None

    @staticmethod
    def _provider(plan: RoutePlan, candidate: Candidate) -> ProviderConfig | None:
        return plan.policy.providers.get(candidate.provider) if plan.policy else None

    def _unavailable(
        self, candidate: Candidate, provider: ProviderConfig | None
    ) -> Unavailable | None:
        if self._providers is None or provider is None:
            return None
        try:
            return self._providers.get(candidate.provider, provider).unavailable()
        except UpstreamError:  # a configuration gap: the attempt reports it as it fails
            return None

    def _missing_env(self, provider: ProviderConfig | None) -> tuple[str, str] | None:
        """The variable (API key, header value) ``provider`` needs and does not have."""
        return provider.missing_env(self._env) if provider is not None else None

    async def _serve(
        self,
        candidate: Candidate,
        provider: ProviderConfig | None,
        attempt: Attempt[T],
        attempts: list[AttemptRecord],
        deadline: float,
        hold: bool,
    ) -> tuple[T, HeldCall | None]:
        breaker = self.state.breakers.get(candidate.provider, candidate.model)
        limit = provider.max_concurrency if provider else None
        # Most calls succeed at once: tenacity's state (a dozen objects in reference cycles,
        # left to the cyclic collector) is built only once a retry may follow.
        try:
            return await self._try_once(candidate, limit, breaker, attempt, attempts, hold)
        except UpstreamError as error:
            if not error.retryable:
                raise
            failed = [error]
        retrying = AsyncRetrying(
            retry=retry_if_exception(lambda exc: isinstance(exc, UpstreamError) and exc.retryable),
            wait=self._wait,
            stop=self._stop(deadline, breaker),
            sleep=self._sleep,
            before_sleep=lambda rs: setattr(attempts[-1], "retry_in_s", rs.upcoming_sleep),
            reraise=True,
        )
        async for try_ in retrying:
            with try_:
                if failed:  # the first try, already made: its failure decides as any other's
                    raise failed.pop()
                return await self._try_once(candidate, limit, breaker, attempt, attempts, hold)
        raise AssertionError("unreachable: tenacity either returns or raises")

    async def _try_once(
        self,
        candidate: Candidate,
        limit: int | None,
        breaker: CircuitBreaker,
        attempt: Attempt[T],
        attempts: list[AttemptRecord],
        hold: bool,
    ) -> tuple[T, HeldCall | None]:
        def skip(detail: str) -> _Skipped:
            attempts.append(AttemptRecord(candidate.model, candidate.provider, "skipped", detail))
            return _Skipped(detail)

        if not breaker.allow():
            raise skip(f"breaker {breaker.state}")
        probe = breaker.state != "closed"  # allowed while not closed: the half-open probe
        if not self.state.inflight.try_acquire(candidate.provider, limit):
            if probe:
                breaker.release_probe()
            raise skip(f"provider at max_concurrency ({limit})")
        call = HeldCall(self.state, candidate, breaker, probe=probe)
        started = self._clock()
        try:
            value = await attempt(candidate)
        except UpstreamError as error:
            self._record_failure(candidate, call, error, attempts, self._clock() - started)
            raise
        except Exception as exc:
            # An attempt function that lets a non-UpstreamError escape: treat it as a broken
            # upstream response so the next candidate still gets its chance. Its text may hold
            # anything (an URL with a key in it): the client gets the type, the log a scrubbed
            # excerpt.
            self._log.warning(
                "upstream_attempt_error",
                model=candidate.model,
                provider=candidate.provider,
                error=redact(f"{type(exc).__name__}: {exc}"),
            )
            error = UpstreamError(
                f"upstream call failed: {type(exc).__name__}",
                retryable=False,
                kind="protocol",
                provider=candidate.provider,
            )
            self._record_failure(candidate, call, error, attempts, self._clock() - started)
            raise error from exc
        except BaseException:
            call.release()
            raise
        call.first_byte_s = self._clock() - started
        attempts.append(
            AttemptRecord(
                candidate.model, candidate.provider, "ok", "served", duration_s=call.first_byte_s
            )
        )
        if hold:
            return value, call  # judged when the stream ends
        call.succeeded()
        return value, None

    def _record_failure(
        self,
        candidate: Candidate,
        call: HeldCall,
        error: UpstreamError,
        attempts: list[AttemptRecord],
        elapsed: float,
    ) -> None:
        call.failed(counts=counts_against_breaker(error))
        attempts.append(
            AttemptRecord(
                candidate.model,
                candidate.provider,
                "failed",
                error.message,
                status=error.status,
                kind=error.kind,
                duration_s=elapsed,
            )
        )
        self._log.info(
            "upstream_attempt_failed",
            model=candidate.model,
            provider=candidate.provider,
            status=error.status,
            kind=error.kind,
            retryable=error.retryable,
        )

    def _wait(self, retry_state: RetryCallState) -> float:
        error = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(error, UpstreamError) and error.retry_after_s is not None:
            return max(0.0, error.retry_after_s)
        return self._backoff(retry_state)

    def _stop(self, deadline: float, breaker: CircuitBreaker) -> Callable[[RetryCallState], bool]:
        settings = self.settings

        def stop(retry_state: RetryCallState) -> bool:
            if retry_state.attempt_number >= settings.max_tries_per_candidate:
                return True
            if breaker.state == "open":
                return True
            error = retry_state.outcome.exception() if retry_state.outcome else None
            retry_after = error.retry_after_s if isinstance(error, UpstreamError) else None
            if retry_after is not None and retry_after > settings.max_retry_after_s:
                return True
            return self._clock() + retry_state.upcoming_sleep > deadline

        return stop
