"""What happens at the end of a /v1 request: settle its limiter reservation, record its usage.

Both go into the settle batch (one pipelined round trip shared by every request that ends in
the same loop turn). ``close`` returns a future that resolves when the record is durable (in
Redis or fsync'ed to the spool); handlers await it before the response's last byte. A request
that reached routing always leaves a usage event, failed ones included (status and zero or
estimated tokens), so reports count errors too.

Usage source: the provider's own ``usage`` when it sent one (for streams, the last usage seen,
so providers that report running usage per chunk give exact partial counts). Otherwise it is
``estimated``: a stream charges the estimated prompt plus one token per content chunk that
upstream produced (how OpenAI-compatible servers stream), a JSON answer the reservation's
estimate. Failed attempts that another candidate retried cost nothing: only the served
attempt's usage is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

from gateway.api.limits_gate import Usage, cost_of
from gateway.api.services import Services
from gateway.api.settler import Settlement
from gateway.limits import LimiterUnavailable, Reservation
from gateway.routing.policy import Policy
from gateway.routing.router import RoutePlan
from gateway.usage import UsageError, UsageEvent

OUTPUT_DELTA_FIELDS = ("content", "tool_calls", "function_call", "refusal", "reasoning_content")


@dataclass
class Accounting:
    """Filled in as the request progresses; ``close`` runs once, at the very end."""

    record_id: str
    key_id: str
    team: str
    route: str
    started: float
    plan: RoutePlan | None = None
    policy: Policy | None = None
    reservation: Reservation | None = None
    estimate: Usage | None = None
    served_model: str | None = None
    served_provider: str | None = None
    attempts: int = 0
    streamed: bool = False
    ttft_ms: int | None = None
    # Content-bearing chunks read from upstream: the produced-token estimate for a stream
    # that ends (client gone, upstream broke) before the provider reported usage.
    streamed_chunks: int = 0
    closed: bool = False

    def close(
        self, services: Services, status: int, usage: Usage | None
    ) -> asyncio.Future[None] | None:
        """Submit the settle and the usage event once; later calls do nothing (None)."""
        if self.closed or self.plan is None or self.policy is None:
            return None  # already closed, or refused before routing: nothing to record
        self.closed = True
        served = self.served_model is not None  # a provider accepted it (a stream may break later)
        if self.reservation is not None and not served:
            services.spawn(_release(services, self.reservation))
        source = "provider"
        if usage is None and served and self.estimate is not None:
            source = "estimated"
            if self.streamed:  # what upstream actually produced before the stream ended
                usage = Usage(self.estimate.prompt_tokens, self.streamed_chunks)
            else:
                usage = self.estimate
        model = self.served_model or self.plan.candidates[0].model
        provider = self.served_provider or self.plan.candidates[0].provider
        tokens = usage.total if usage else 0
        cost = cost_of(self.policy, model, usage) if usage else 0
        try:
            event = UsageEvent(
                time=time.time(),
                request_id=self.record_id,
                key_id=self.key_id,
                model=model,
                provider=provider,
                team=self.team,
                task=self.plan.task or "",
                route=self.route,
                prompt_tokens=usage.prompt_tokens if usage else 0,
                completion_tokens=usage.completion_tokens if usage else 0,
                cached_tokens=min(usage.cached_tokens, usage.prompt_tokens) if usage else 0,
                cost_nanos=cost,
                policy_version=self.plan.policy_version,
                latency_ms=int((time.perf_counter() - self.started) * 1000),
                ttft_ms=self.ttft_ms,
                status=status,
                streamed=self.streamed,
                usage_source=source,
                attempts=max(self.attempts, 1),
            )
        except UsageError as exc:  # never fail a served request over its bookkeeping
            services.log.error("usage_event_invalid", record_id=self.record_id, error=str(exc))
            event = None
        if event is not None:
            _count(services, event)
        reservation = self.reservation if served else None
        if reservation is None and event is None:
            return None
        return services.settler.submit(Settlement(reservation, tokens, cost, event))


def _count(services: Services, event: UsageEvent) -> None:
    """Token and cost counters carry exactly what the ledger records (cost in whole
    nano-dollars: integer increments, so the counter stays exact up to 2**53)."""
    metrics = services.metrics
    if event.prompt_tokens:
        metrics.tokens.labels(event.model, "prompt").inc(event.prompt_tokens)
    if event.completion_tokens:
        metrics.tokens.labels(event.model, "completion").inc(event.completion_tokens)
    if event.cached_tokens:
        metrics.tokens.labels(event.model, "cached").inc(event.cached_tokens)
    if event.cost_nanos:
        metrics.cost.labels(event.model).inc(event.cost_nanos)


def produced_tokens(chunk: Any) -> int:
    """Choices in one stream chunk that carry new output: about one token each, as
    OpenAI-compatible servers stream (role-only, finish-only and usage-only chunks count 0)."""
    if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
        return 0
    count = 0
    for choice in chunk["choices"]:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if any(delta.get(name) for name in OUTPUT_DELTA_FIELDS):
                count += 1
        elif choice.get("text"):
            count += 1
    return count


async def _release(services: Services, reservation: Reservation) -> None:
    with contextlib.suppress(LimiterUnavailable):  # the lease expiry gives it back later
        await services.limiter.release(reservation)
