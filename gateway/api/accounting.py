"""What happens after a /v1 request: settle its limiter reservation and record its usage.

Both go into the after-response batch (one pipelined round trip). A request that reached
routing always leaves a usage event, failed ones included (status and zero or estimated
tokens), so reports count errors too.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from gateway.api.limits_gate import Usage, cost_of
from gateway.api.services import Services
from gateway.api.settler import Settlement
from gateway.limits import LimiterUnavailable, Reservation
from gateway.policy import Policy
from gateway.router import RoutePlan
from gateway.usage import UsageError, UsageEvent


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

    def close(self, services: Services, status: int, usage: Usage | None) -> None:
        if self.plan is None or self.policy is None:
            return  # refused before routing: nothing reserved, nothing to record
        served = self.served_model is not None  # a provider accepted it (a stream may break later)
        if self.reservation is not None and not served:
            services.spawn(_release(services, self.reservation))
        source = "provider"
        if usage is None and served and self.estimate is not None:
            usage, source = self.estimate, "estimated"  # no usage reported: charge the estimate
        model = self.served_model or self.plan.candidates[0].model
        provider = self.served_provider or self.plan.candidates[0].provider
        tokens = usage.total if usage else 0
        cost = cost_of(self.policy, model, usage) if usage else 0.0
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
                cost_usd=cost,
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
        reservation = self.reservation if served else None
        if reservation is not None or event is not None:
            services.settler.submit(Settlement(reservation, tokens, cost, event))


async def _release(services: Services, reservation: Reservation) -> None:
    with contextlib.suppress(LimiterUnavailable):  # the lease expiry gives it back later
        await services.limiter.release(reservation)
