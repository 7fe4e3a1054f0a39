"""Per-key rate limits (requests and tokens per minute) and budgets, exact across replicas.

All state lives in Redis and every check-and-take is one Lua script in one round trip, so any
number of gateway replicas share the limits exactly. Requests and tokens use a sliding window
of sub-buckets (no refill within the window, no double burst at an edge); budgets are
nano-dollar integers (``gateway/money.py``) per UTC day, month or forever. See docs/limits.md
for the algorithm and the exact admission rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

import redis.asyncio
import redis.exceptions

from gateway.errors import RateLimited, ServiceUnavailable
from gateway.money import MAX_SAFE_NANOS, format_usd_short, nanos_to_usd
from gateway.store.connect import REDIS_UNAVAILABLE
from gateway.store.direct import DirectRedis
from gateway.store.scripts import LuaScript, ScriptBatch

BudgetPeriod = Literal["day", "month", "total"]
_PERIODS = ("day", "month", "total")
# A refusal that waiting cannot cure (rpm 0, a request bigger than the tpm, a spent total
# budget) still needs an integer Retry-After. Those, and waits longer than the window (a spent
# day or month budget), add x-should-retry: false, which the OpenAI SDKs obey.
_NEVER_RETRY_AFTER_S = 86_400

# Redis unreachable, timed out, still loading its data, a replica that cannot take writes, or a
# cluster slot without a reachable master during a failover.
_UNAVAILABLE_ERRORS = REDIS_UNAVAILABLE


class LimiterUnavailable(ServiceUnavailable):
    """Redis is unreachable or timed out; renders as a 503 unless the caller decides otherwise."""

    default_code = "limiter_unavailable"


@dataclass(frozen=True)
class KeyLimits:
    rpm: int | None = None  # requests per minute (per limiter window)
    tpm: int | None = None  # tokens per minute (per limiter window)
    budget_nanos: int | None = None  # nano-dollars per budget period (gateway/money.py)
    budget_period: BudgetPeriod = "month"

    def __post_init__(self) -> None:
        for name in ("rpm", "tpm"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ValueError(f"{name} must be a non-negative integer or None, got {value!r}")
        if self.budget_nanos is not None:
            _check_nanos(self.budget_nanos, "budget_nanos")
        if self.budget_period not in _PERIODS:
            raise ValueError(
                f"budget_period must be one of {', '.join(_PERIODS)}, got {self.budget_period!r}"
            )


@dataclass(frozen=True)
class Reservation:
    key_id: str
    request_id: str
    tokens: int
    cost_nanos: int
    at: float  # Redis server time (epoch seconds) when the reservation was taken
    budget_window: str | None  # "2025-06-01", "2025-06" or "total"; None without a budget
    headers: dict[str, str] = field(default_factory=dict)  # x-ratelimit-* for the response


def format_duration(ms: float) -> str:
    """OpenAI's reset format: "20ms", "1s", "1.5s", "6m0s", "1h2m3s"."""
    ms = max(0, round(ms))
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{minutes}m{seconds}"
    return seconds


def _check_nanos(nanos: int, name: str = "cost_nanos") -> int:
    if isinstance(nanos, bool) or not isinstance(nanos, int) or nanos < 0:
        raise ValueError(f"{name} must be a non-negative integer of nano-dollars, got {nanos!r}")
    if name == "budget_nanos" and nanos > MAX_SAFE_NANOS:
        raise ValueError(f"budget_nanos must be at most {MAX_SAFE_NANOS}, got {nanos!r}")
    return nanos


def _lua_nanos(nanos: int) -> int:
    """What the scripts may see: Lua numbers are doubles, exact only below 2**53. A charge that
    large (over $9M) exceeds every budget the limiter accepts, so capping it changes no verdict."""
    return min(_check_nanos(nanos), MAX_SAFE_NANOS)


def _check_tokens(tokens: int) -> int:
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be a non-negative integer, got {tokens!r}")
    return tokens


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _script_source(name: str) -> str:
    package = resources.files("gateway.metering") / "lua"
    return (package / "limits_common.lua").read_text() + (package / name).read_text()


class Limiter:
    """Reserve before a request, settle (or release) after it. One instance per app."""

    def __init__(
        self,
        redis: redis.asyncio.Redis,
        *,
        key_prefix: str = "sy",
        window_s: float = 60.0,
        buckets: int = 60,
        lease_s: float = 3600.0,
    ) -> None:
        """``window_s`` is the rate-limit window (60 s: "per minute"), cut into ``buckets``
        sub-buckets; ``lease_s`` is how long a reservation may stay unsettled before its
        budget hold is given back (its holder is presumed dead)."""
        window_ms = round(window_s * 1000)
        if buckets < 1 or window_ms < buckets or window_ms % buckets:
            raise ValueError(
                f"window_s={window_s} must be a whole number of ms divisible by buckets={buckets}"
            )
        if lease_s <= 0:
            raise ValueError(f"lease_s must be positive, got {lease_s}")
        self._redis = redis
        self._direct = DirectRedis(redis)  # the per-request calls skip redis-py's pool machinery
        self._prefix = key_prefix
        self._window_ms = window_ms
        self._buckets = buckets
        self._lease_ms = round(lease_s * 1000)
        self._reserve_lua = LuaScript.of(_script_source("limits_reserve.lua"))
        self._settle_lua = LuaScript.of(_script_source("limits_settle.lua"))
        self._status_lua = LuaScript.of(_script_source("limits_status.lua"))

    def keys(self, key_id: str) -> list[str]:
        """The Redis keys of one API key, all in one cluster hash slot (order matters)."""
        if not isinstance(key_id, str) or not key_id:
            raise ValueError(f"key_id must be a non-empty string, got {key_id!r}")
        base = f"{self._prefix}:{{key:{key_id}}}:"
        return [
            base + "rpm",
            base + "tpm",
            base + "held",
            base + "leases",
            base + "budget:day",
            base + "budget:month",
            base + "budget:total",
        ]

    async def reserve(
        self, key_id: str, limits: KeyLimits, *, tokens: int, cost_nanos: int, request_id: str
    ) -> Reservation:
        """Take 1 request, ``tokens`` tokens and ``cost_nanos`` nano-dollars of budget, or raise
        RateLimited (see docs/limits.md for the admission rule)."""
        nanos = _lua_nanos(cost_nanos)
        _check_tokens(tokens)
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        args = [
            request_id,
            tokens,
            nanos,
            -1 if limits.rpm is None else limits.rpm,
            -1 if limits.tpm is None else limits.tpm,
            -1 if limits.budget_nanos is None else limits.budget_nanos,
            limits.budget_period,
            self._window_ms,
            self._buckets,
            self._lease_ms,
        ]
        reply = await self._call(self._reserve_lua, self.keys(key_id), args)
        status = int(reply[0])
        if status == -1:
            raise ValueError(f"request id {request_id!r} already holds a reservation")
        if status == 0:
            raise self._refusal(limits, tokens, cost_nanos, reply)
        _, now_ms, rpm_used, tpm_used, rpm_reset, tpm_reset, window = reply
        return Reservation(
            key_id=key_id,
            request_id=request_id,
            tokens=tokens,
            cost_nanos=nanos,
            at=int(now_ms) / 1000,
            budget_window=_text(window) or None,
            headers=self._headers(limits, int(rpm_used), int(tpm_used), rpm_reset, tpm_reset),
        )

    def queue_settle(
        self, batch: ScriptBatch, reservation: Reservation, *, tokens: int, cost_nanos: int
    ) -> int:
        """Queue the settle on a ``ScriptBatch`` (EVALSHA, shares its round trip); returns the
        position of its reply. The hot path's way: the batch recovers from NOSCRIPT itself."""
        keys, args = self._settle_call(reservation, "settle", tokens, cost_nanos)
        return batch.call(self._settle_lua, keys, args)

    def add_settle(
        self,
        pipe: redis.asyncio.client.Pipeline,
        reservation: Reservation,
        *,
        tokens: int,
        cost_nanos: int,
    ) -> None:
        """Queue the settle on a redis-py pipeline the caller executes itself.

        Sent as EVAL with the full source, not EVALSHA: a plain pipeline cannot fall back on
        NOSCRIPT after a Redis restart. Prefer ``queue_settle`` where a ``ScriptBatch`` fits.
        """
        keys, args = self._settle_call(reservation, "settle", tokens, cost_nanos)
        pipe.eval(self._settle_lua.source, len(keys), *keys, *args)

    async def settle(self, reservation: Reservation, *, tokens: int, cost_nanos: int) -> bool:
        """Replace the estimate by what was used: refunds the rest, charges any excess.

        Returns False when the reservation was already settled or released (a no-op)."""
        keys, args = self._settle_call(reservation, "settle", tokens, cost_nanos)
        return bool(await self._call(self._settle_lua, keys, args))

    async def release(self, reservation: Reservation) -> bool:
        """The request never reached a provider: give back the request, tokens and budget."""
        keys, args = self._settle_call(reservation, "release", 0, 0)
        return bool(await self._call(self._settle_lua, keys, args))

    async def status(self, key_id: str, limits: KeyLimits) -> dict[str, Any]:
        """Usage and what is left in the current windows, for admin views."""
        args = [limits.budget_period, self._window_ms, self._buckets]
        reply = await self._call(self._status_lua, self.keys(key_id), args)
        now_ms, rpm_used, tpm_used, rpm_reset, tpm_reset = (int(v) for v in reply[:5])
        window, window_end = _text(reply[5]), int(reply[6])
        spent, held, in_flight = int(reply[7]), int(reply[8]), int(reply[9])

        def window_view(limit: int | None, used: int, reset_ms: int) -> dict[str, Any]:
            return {
                "limit": limit,
                "used": used,
                "remaining": None if limit is None else max(0, limit - used),
                "reset_s": reset_ms / 1000,
            }

        budget = limits.budget_nanos
        remaining = None if budget is None else max(0, budget - spent - held)
        return {
            "key_id": key_id,
            "at": now_ms / 1000,
            "window_s": self._window_ms / 1000,
            "requests": window_view(limits.rpm, rpm_used, rpm_reset),
            "tokens": window_view(limits.tpm, tpm_used, tpm_reset),
            "budget": {
                "period": limits.budget_period,
                "window": window,
                "limit_nanos": budget,
                "spent_nanos": spent,
                "reserved_nanos": held,
                "remaining_nanos": remaining,
                # float renderings of the integers above, for people
                "limit_usd": None if budget is None else nanos_to_usd(budget),
                "spent_usd": nanos_to_usd(spent),
                "reserved_usd": nanos_to_usd(held),
                "remaining_usd": None if remaining is None else nanos_to_usd(remaining),
                "resets_in_s": None if window_end < 0 else (window_end - now_ms) / 1000,
            },
            "in_flight": in_flight,
        }

    def _settle_call(
        self, reservation: Reservation, mode: str, tokens: int, cost_nanos: int
    ) -> tuple[list[str], list[Any]]:
        _check_tokens(tokens)
        nanos = _lua_nanos(cost_nanos)
        keys = self.keys(reservation.key_id)
        return keys, [reservation.request_id, mode, tokens, nanos, self._window_ms, self._buckets]

    async def _call(self, script: LuaScript, keys: list[str], args: list[Any]) -> Any:
        """EVALSHA on a ``DirectRedis`` (redis-py's Script wrapper and pool checkout cost more
        than the call on the hot path); on NOSCRIPT (a restart, a failover, SCRIPT FLUSH) the
        same run goes as EVAL with the source on the same connection. Any failure, whatever
        Redis or the client library raised, is a 503 ``redis_unavailable``, never a 500."""
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        fallback = ("EVAL", script.source, len(keys), *keys, *args)
        try:
            return await self._direct.script(command, fallback)
        except _UNAVAILABLE_ERRORS as exc:
            raise LimiterUnavailable(
                f"rate limiter unavailable: {type(exc).__name__}", code="redis_unavailable"
            ) from exc
        except Exception as exc:  # an error reply, or redis-py failing mid-teardown
            raise LimiterUnavailable(
                f"rate limiter unavailable: unexpected {type(exc).__name__} from Redis",
                code="redis_unavailable",
            ) from exc

    def _headers(
        self, limits: KeyLimits, rpm_used: int, tpm_used: int, rpm_reset: Any, tpm_reset: Any
    ) -> dict[str, str]:
        """x-ratelimit-* for the limits the key has; a limit the key lacks gets no headers."""
        headers: dict[str, str] = {}
        for kind, limit, used, reset in (
            ("requests", limits.rpm, rpm_used, rpm_reset),
            ("tokens", limits.tpm, tpm_used, tpm_reset),
        ):
            if limit is None:
                continue
            headers[f"x-ratelimit-limit-{kind}"] = str(limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, limit - used))
            headers[f"x-ratelimit-reset-{kind}"] = format_duration(int(reset))
        return headers

    def _refusal(
        self, limits: KeyLimits, tokens: int, cost_nanos: int, reply: list[Any]
    ) -> RateLimited:
        reason = _text(reply[1])
        retry_ms = int(reply[2])
        rpm_used, tpm_used = int(reply[4]), int(reply[5])
        spent, held = int(reply[8]), int(reply[9])
        headers = self._headers(limits, rpm_used, tpm_used, reply[6], reply[7])
        if retry_ms < 0:
            headers["retry-after"] = str(_NEVER_RETRY_AFTER_S)
        else:
            headers["retry-after"] = str(max(1, math.ceil(retry_ms / 1000)))
        if retry_ms < 0 or retry_ms > self._window_ms:
            headers["x-should-retry"] = "false"
        wait = "" if retry_ms < 0 else f" Retry in {format_duration(retry_ms)}."
        if reason == "budget":
            message = (
                f"Budget exceeded: this key may spend {format_usd_short(limits.budget_nanos or 0)}"
                f" per {limits.budget_period if limits.budget_period != 'total' else 'lifetime'};"
                f" spent {format_usd_short(spent)}, held by requests in flight"
                f" {format_usd_short(held)}, this request needs up to"
                f" {format_usd_short(cost_nanos)}.{wait}"
            )
            return RateLimited(
                message, error_type="insufficient_quota", code="insufficient_quota", headers=headers
            )
        if reason == "rpm":
            message = (
                f"Rate limit reached for requests per minute (rpm): limit {limits.rpm},"
                f" used {rpm_used}.{wait}"
            )
        elif tokens > (limits.tpm or 0):
            message = (
                f"Request too large for tokens per minute (tpm): limit {limits.tpm},"
                f" this request needs {tokens} tokens."
            )
        else:
            message = (
                f"Rate limit reached for tokens per minute (tpm): limit {limits.tpm},"
                f" used {tpm_used}, this request needs {tokens}.{wait}"
            )
        return RateLimited(
            message, error_type="rate_limit_exceeded", code="rate_limit_exceeded", headers=headers
        )
