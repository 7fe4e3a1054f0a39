"""Reserve a key's limits before the upstream call and settle them after, with the Redis policy.

The reservation is the request's worst case: the prompt's upper bound (``prompt_token_bound``:
UTF-8 bytes plus framing, never fewer than a provider bills) plus ``max_tokens`` for each of
its ``max(n, best_of)`` choices (none for embeddings), priced at the most expensive candidate of
the plan, since any fallback may serve it. Money is integer nano-dollars. The typical estimate
(``estimate_prompt_tokens``) is what a request without provider usage is recorded at.

A key of a team is always reserved (its team's limits are read by the script itself, in the
team's slot). A reserve that finds the key's limits state elsewhere than its cached record says
(the key changed teams) re-reads the record and tries again; one that finds the new home not
yet open sweeps the move first (``metering/moves.py``).

``SWITCHYARD_LIMITS_ON_REDIS_FAILURE=closed`` turns a Redis outage into 503; ``open`` serves keys
verified within ``fail_open_window_s`` without limits, counted in a metric and logged (once a
second at most). Recovery needs no restart: the next request simply finds Redis again.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from gateway.access.auth import Principal
from gateway.access.keys import KeyRecord
from gateway.access.teams import team_of_home
from gateway.errors import ServiceUnavailable
from gateway.formats.internal import Usage
from gateway.metering.limits import (
    AlreadyHeld,
    HomeChanged,
    KeyLimits,
    Limiter,
    LimiterUnavailable,
    Reservation,
)
from gateway.metering.moves import LimitMoves
from gateway.metrics import Metrics
from gateway.policy import Policy
from gateway.routing.estimate import (
    estimate_prompt_tokens,
    expected_output_tokens,
    prompt_token_bound,
)
from gateway.routing.router import RoutePlan
from gateway.settings import LimiterSettings

# Routes whose answers produce no completion tokens: their estimate is the prompt alone.
PROMPT_ONLY_ROUTES = frozenset(
    {"embeddings", "moderations", "audio.speech", "messages.count_tokens"}
)


def key_limits(record: KeyRecord) -> KeyLimits | None:
    """The key's own limits; None when it has none (its team's, if any, are the script's)."""
    if (
        record.rpm is None
        and record.tpm is None
        and record.budget_nanos is None
        and record.max_parallel_requests is None
    ):
        return None
    return KeyLimits(
        record.rpm,
        record.tpm,
        record.budget_nanos,
        record.budget_period or "month",  # type: ignore[arg-type]
        record.max_parallel_requests,
        budget_soft=record.budget_mode == "soft",
        alert_thresholds=tuple(record.alert_thresholds or ()),
    )


# What a key of a team without limits of its own reserves under (its team's are the script's).
NO_KEY_LIMITS = KeyLimits()

# A reserve that meets a key changing teams re-reads its record and tries this many times.
HOME_TRIES = 3


def cost_of(policy: Policy, model: str, usage: Usage, *, batch: bool = False) -> int:
    """Nano-dollars, exact: tokens times the model's per-token prices (0 for unknown models);
    a batch's line at the model's batch price, if its ``price:`` has one."""
    config = policy.models.get(model)
    if config is None:
        return 0
    price = config.price.batch if batch and config.price.batch is not None else config.pricing
    return price.cost_nanos(
        usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens, usage.cache_write_tokens
    )


def worst_case_cost(policy: Policy, plan: RoutePlan, usage: Usage) -> int:
    """The estimate priced at the plan's most expensive candidate: any of them may serve."""
    return max((cost_of(policy, c.model, usage) for c in plan.candidates), default=0)


def estimate_usage(body: Mapping[str, Any], route: str, default_max_tokens: int) -> Usage:
    """The typical usage (about four characters a token): recorded when no provider counts."""
    return _usage(estimate_prompt_tokens(body), body, route, default_max_tokens)


def usage_bound(body: Mapping[str, Any], route: str, default_max_tokens: int) -> Usage:
    """The most a provider may bill for the request: what the limiter reserves."""
    return _usage(prompt_token_bound(body), body, route, default_max_tokens)


def completion_default(policy: Policy, plan: RoutePlan, settings: LimiterSettings) -> int:
    """The completion a request that sets no ``max_tokens`` may reach at any candidate: a
    model's policy ``defaults.max_tokens`` is sent upstream for it, and may exceed the
    gateway-wide default."""
    most = settings.default_max_tokens
    for candidate in plan.candidates:
        config = policy.models.get(candidate.model)
        if config is not None and config.defaults is not None and config.defaults.max_tokens:
            most = max(most, config.defaults.max_tokens)
    return most


def _usage(prompt: int, body: Mapping[str, Any], route: str, default_max_tokens: int) -> Usage:
    if route in PROMPT_ONLY_ROUTES:
        return Usage(prompt, 0)
    return Usage(prompt, expected_output_tokens(body, default_max_tokens))


@dataclass(eq=False)
class LimitsGate:
    """Reserves a request's worst case with the limiter, in one Redis round trip."""

    limiter: Limiter
    settings: LimiterSettings
    metrics: Metrics
    log: Any
    _: KW_ONLY
    moves: LimitMoves
    # Re-reads a key's record (and replaces the cached one).
    refresh: Callable[[str], Awaitable[KeyRecord | None]]
    # Last time a fail-open warning was logged (monotonic): an outage logs once a second.
    _last_fail_open_warning: float = field(default=0.0, init=False)

    async def reserve(
        self,
        principal: Principal,
        plan: RoutePlan,
        body: Mapping[str, Any],
        policy: Policy,
        reservation_id: str,
        route: str = "chat.completions",
        *,
        hold_ms: int | None = None,
    ) -> tuple[Reservation | None, Usage]:
        """One Redis round trip; returns the reservation (None when unlimited) and the
        typical estimate. The reservation holds the usage bound; with ``hold_ms``, only its
        worst-case cost, against the budgets alone, for that long (a line of a provider's
        batch: ``Limiter.reserve``)."""
        estimate = estimate_usage(body, route, self.settings.default_max_tokens)
        record = principal.record
        limits = key_limits(record)
        in_team = team_of_home(record.limits_home) is not None
        if limits is None and not in_team:
            return None, estimate
        if principal.degraded:  # Redis was already unreachable at authentication
            self._fail_open(principal, "redis unreachable at authentication")
            return None, estimate
        bound = usage_bound(body, route, completion_default(policy, plan, self.settings))
        priced = in_team or (limits is not None and limits.budget_nanos is not None)
        cost = worst_case_cost(policy, plan, bound) if priced else 0
        tokens = bound.total_tokens if hold_ms is None else 0
        try:
            reservation = await self._reserve(record, limits, cost, tokens, reservation_id, hold_ms)
        except AlreadyHeld as again:
            if hold_ms is None:
                raise
            reservation = again.held  # a hold taken again (after a crash) is the one held
        except LimiterUnavailable:
            if self.settings.on_redis_failure != "open":
                raise
            self._fail_open(principal, "limiter unavailable")
            return None, estimate
        return reservation, estimate

    async def _reserve(
        self,
        record: KeyRecord,
        limits: KeyLimits | None,
        cost: int,
        tokens: int,
        reservation_id: str,
        hold_ms: int | None,
    ) -> Reservation:
        """The reserve, following the key to its current home if it changed teams
        (``limits``: the key's own, as ``key_limits`` made them from ``record``)."""
        for _ in range(HOME_TRIES):
            try:
                return await self.limiter.reserve(
                    record.id,
                    limits or NO_KEY_LIMITS,
                    tokens=tokens,
                    cost_nanos=cost,
                    request_id=reservation_id,
                    home=record.home,
                    epoch=record.home_epoch,
                    hold_ms=hold_ms,
                )
            except HomeChanged as changed:
                try:
                    if changed.moving:
                        await self.moves.sweep_key(record.id)
                    fresh = await self.refresh(record.id)
                except LimiterUnavailable:
                    raise
                except Exception as exc:  # Redis failed under the sweep or the read
                    raise LimiterUnavailable(
                        f"rate limiter unavailable: {type(exc).__name__}", code="redis_unavailable"
                    ) from exc
                if fresh is not None:
                    record, limits = fresh, key_limits(fresh)
        raise ServiceUnavailable(
            "This key is changing teams; retry in a moment.",
            code="key_moving",
            headers={"retry-after": "1"},
        )

    def _fail_open(self, principal: Principal, why: str) -> None:
        self.metrics.fail_open.inc()
        now = time.monotonic()
        if now - self._last_fail_open_warning >= 1.0:
            self._last_fail_open_warning = now
            self.log.warning("limits_fail_open", key_id=principal.key_id, reason=why)
