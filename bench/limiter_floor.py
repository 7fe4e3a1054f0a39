"""The least an exact limiter shared by replicas costs a request: one Redis round trip before
the upstream call, with no limit in it.

``python -m bench.parts`` serves one gateway (part "key without limits + one round trip") with
this installed, by ``bench/limiter_floor_site/sitecustomize.py`` on its ``PYTHONPATH``: a
request whose key has no limits, which reserves nothing, still makes one script call on the
limiter's own connection before its upstream call, a script that only reads the server's
clock. docs/limits.md's exactness (replicas sharing a limit admit exactly as many requests as
it allows) needs every admission decided in the shared store before the upstream call, so no
limiter that keeps it can cost less than this; the real one checks windows, budgets and holds
in that call and settles them after. A bench-side instrument: the product never loads it.
"""

from __future__ import annotations

from typing import Any

from gateway.metering.gate import LimitsGate

CLOCK_ONLY = ("EVAL", "return redis.call('TIME')", 0)


def install() -> None:
    """Every reservation of a key without limits makes the one round trip first."""
    reserve = LimitsGate.reserve

    async def reserve_after_a_round_trip(self: LimitsGate, *args: Any, **kwargs: Any) -> Any:
        reservation, estimate = await reserve(self, *args, **kwargs)
        if reservation is None:
            await self.limiter._direct.script(CLOCK_ONLY, CLOCK_ONLY)
        return reservation, estimate

    LimitsGate.reserve = reserve_after_a_round_trip  # type: ignore[method-assign]
