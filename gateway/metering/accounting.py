"""What happens at the end of a /v1 request: settle its limiter reservation, record its usage.

Both go into the settle batch (one pipelined round trip shared by every request that ends in
the same loop turn). ``Accountant.close`` returns a future that resolves when the record is
durable (in Redis or fsync'ed to the spool); handlers await it before the response's last byte. A request
that reached routing always leaves a usage event, failed ones included (status and zero or
estimated tokens), so reports count errors too.

Usage source: the provider's own ``usage`` when it sent one (for streams, the last usage seen,
so providers that report running usage per chunk give exact partial counts). Otherwise it is
``estimated``: a stream charges the estimated prompt plus one token per content chunk that
upstream produced (how OpenAI-compatible servers stream), a JSON answer the typical estimate
(the reservation held an upper bound). Failed attempts that another candidate retried cost nothing: only the served
attempt's usage is recorded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from gateway.cache import BYPASS, HIT
from gateway.formats.internal import Usage
from gateway.ledger import UsageError, UsageEvent
from gateway.ledger.ids import time_ordered_id
from gateway.metering.attribution import NOBODY, Attribution
from gateway.metering.gate import cost_of
from gateway.metering.limits import Limiter, LimiterUnavailable, Reservation
from gateway.metering.settler import SettleBatcher, Settlement
from gateway.metrics import Metrics
from gateway.policy import Policy
from gateway.routing.router import RoutePlan


@dataclass
class Accounting:
    """The books of one request, opened with it and filled in as it goes: who sent it (once
    authenticated), its route (once routed: from then on it leaves a usage event, failed or
    not), what it reserved and who served it; ``Accountant.close`` closes them once, at the
    very end."""

    route: str
    started: float
    record_id: str = field(default_factory=time_ordered_id)  # the usage event's id
    key_id: str | None = None
    team: str = ""
    plan: RoutePlan | None = None
    policy: Policy | None = None
    reservation: Reservation | None = None
    estimate: Usage | None = None
    served_model: str | None = None
    served_provider: str | None = None
    route_reason: str | None = None  # why the served candidate was chosen ("cache": a hit)
    attempts: int = 0
    streamed: bool = False
    ttft_ms: int | None = None
    # Content-bearing chunks read from upstream: the produced-token estimate for a stream
    # that ends (client gone, upstream broke) before the provider reported usage.
    streamed_chunks: int = 0
    # What the response cache said (``x-switchyard-cache``): a hit had no upstream call, so
    # no cost and no tokens against TPM.
    cache: str = BYPASS
    # The end user and tags the request's cost is attributed to.
    attribution: Attribution = NOBODY
    # A batch's line: priced at the models' batch prices (docs/batches.md).
    batch: bool = False

    @property
    def routed(self) -> bool:
        return self.plan is not None

    @property
    def cache_hit(self) -> bool:
        return self.cache == HIT


class Accountant:
    """Closes the books of each request: the limiter's settle (or release) and the usage
    event, submitted to the settle batch; the token and cost counters."""

    def __init__(self, settler: SettleBatcher, limiter: Limiter, metrics: Metrics, log: Any):
        self.settler = settler
        self.limiter = limiter
        self.metrics = metrics
        self.log = log
        # Releases that must finish even if the client has gone; awaited at shutdown.
        self._background: set[asyncio.Task[None]] = set()

    def close(
        self, books: Accounting, status: int, usage: Usage | None
    ) -> asyncio.Future[None] | None:
        """Submit the settle and the usage event (called once, at the request's end); None
        when there is nothing to wait for."""
        if books.plan is None or books.policy is None or books.key_id is None:
            return None  # refused before routing: nothing to record
        served = books.served_model is not None  # a provider accepted it (a stream may break later)
        if books.reservation is not None and not served:
            self._spawn(self._release(books.reservation))
        source = "provider"
        if usage is None and served and books.estimate is not None:
            source = "estimated"
            if books.streamed:  # what upstream actually produced before the stream ended
                usage = Usage(books.estimate.prompt_tokens, books.streamed_chunks)
            else:
                usage = books.estimate
        model = books.served_model or books.plan.candidates[0].model
        provider = books.served_provider or books.plan.candidates[0].provider
        tokens = usage.total_tokens if usage else 0
        cost = cost_of(books.policy, model, usage, batch=books.batch) if usage else 0
        priced = books.policy.models.get(model)
        catalogue = priced.price_catalogue if priced is not None else ""
        if books.cache_hit:
            source, tokens, cost = "cache", 0, 0
        try:
            event = UsageEvent(
                event_id=books.record_id,
                time_ms=int(time.time() * 1000),
                key_id=books.key_id,
                model=model,
                provider=provider,
                team=books.team,
                task=books.plan.task or "",
                route=books.route,
                prompt_tokens=usage.prompt_tokens if usage else 0,
                completion_tokens=usage.completion_tokens if usage else 0,
                cached_tokens=min(usage.cached_tokens, usage.prompt_tokens) if usage else 0,
                cache_write_tokens=_cache_writes(usage),
                cost_nanos=cost,
                policy_version=books.plan.policy_version,
                latency_ms=int((time.perf_counter() - books.started) * 1000),
                ttft_ms=books.ttft_ms,
                status=status,
                streamed=books.streamed,
                usage_source=source,
                attempts=max(books.attempts, 1),
                end_user=books.attribution.end_user,
                tags=books.attribution.tags,
                price_catalogue=catalogue,
            )
        except UsageError as exc:  # never fail a served request over its bookkeeping
            self.log.error("usage_event_invalid", record_id=books.record_id, error=str(exc))
            event = None
        if event is not None:
            self._count(event)
        reservation = books.reservation if served else None
        if reservation is None and event is None:
            return None
        return self.settler.submit(Settlement(reservation, tokens, cost, event))

    async def wait_background(self, timeout_s: float = 5.0) -> None:
        """At shutdown: let the releases still in flight finish (bounded)."""
        if self._background:
            await asyncio.wait(list(self._background), timeout=timeout_s)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _release(self, reservation: Reservation) -> None:
        try:
            await self.limiter.release(reservation)
        except LimiterUnavailable:  # the settle spool gives it back once Redis answers
            await self.settler.release_later(reservation)

    def _count(self, event: UsageEvent) -> None:
        """Token and cost counters carry exactly what the ledger records (cost in whole
        nano-dollars: integer increments, so the counter stays exact up to 2**53)."""
        metrics = self.metrics
        if event.prompt_tokens:
            metrics.tokens.labels(event.model, "prompt").inc(event.prompt_tokens)
        if event.completion_tokens:
            metrics.tokens.labels(event.model, "completion").inc(event.completion_tokens)
        if event.cached_tokens:
            metrics.tokens.labels(event.model, "cached").inc(event.cached_tokens)
        if event.cache_write_tokens:
            metrics.tokens.labels(event.model, "cache_write").inc(event.cache_write_tokens)
        if event.cost_nanos:
            metrics.cost.labels(event.model).inc(event.cost_nanos)


def _cache_writes(usage: Usage | None) -> int:
    """Cache writes as recorded: never more than the prompt tokens left after cache reads."""
    if usage is None:
        return 0
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    return max(min(usage.cache_write_tokens, usage.prompt_tokens - cached), 0)
