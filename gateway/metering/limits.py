"""Per-key and per-team rate limits, budgets and in-flight caps, exact across replicas.

All state lives in Redis and every check-and-take is one Lua script in one round trip, so any
number of gateway replicas share the limits exactly. Requests and tokens use a sliding window
of sub-buckets (no refill within the window, no double burst at an edge); budgets are
nano-dollar integers (``gateway/money.py``) per UTC day, ISO week, month or forever; in-flight
requests (``max_parallel_requests``) hold a short lease that this gateway renews while they
run, so a dead gateway's requests stop counting once their leases lapse.

A key of a team is checked together with its team in the same script: the key's state lives in
the team's hash slot (its *home*, ``gateway/access/teams.py``), so one Cluster node holds both.
See docs/limits.md for the algorithm, the admission rule and how a key changes teams.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

import redis.asyncio
import redis.exceptions

from gateway.access.teams import key_home, team_of_home
from gateway.errors import ServiceUnavailable
from gateway.metering.limit_replies import format_duration, rate_headers, refusal
from gateway.money import MAX_SAFE_NANOS, nanos_to_usd
from gateway.store.connect import REDIS_UNAVAILABLE
from gateway.store.direct import DirectRedis
from gateway.store.scripts import LuaScript, ScriptBatch

__all__ = [
    "AlreadyHeld",
    "BudgetCrossing",
    "BudgetPeriod",
    "HomeChanged",
    "KeyLimits",
    "Limiter",
    "LimiterUnavailable",
    "Reservation",
    "format_duration",
]

BudgetPeriod = Literal["day", "week", "month", "total"]
PERIODS = ("day", "week", "month", "total")
# The keys of one scope, in the order the scripts read them (limits_common.lua).
SCOPE_PARTS = (
    "rpm",
    "tpm",
    "held",
    "leases",
    "budget:day",
    "budget:month",
    "budget:total",
    "budget:week",
    "inflight",
    "state",
)
_KEY_SCOPE, _TEAM_SCOPE = 1, 2  # bits of Reservation.in_flight

# Redis unreachable, timed out, still loading its data, a replica that cannot take writes, or a
# cluster slot without a reachable master during a failover.
_UNAVAILABLE_ERRORS = REDIS_UNAVAILABLE


class LimiterUnavailable(ServiceUnavailable):
    """Redis is unreachable or timed out; renders as a 503 unless the caller decides otherwise."""

    default_code = "limiter_unavailable"


class AlreadyHeld(ValueError):
    """The request id already holds a reservation: ``held`` is it, as far as the caller can
    settle it (a budget hold taken again after a crash settles the one taken before)."""

    def __init__(self, held: Reservation) -> None:
        super().__init__(f"request id {held.request_id!r} already holds a reservation")
        self.held = held


@dataclass(eq=False)  # an exception keeps its identity hash
class HomeChanged(Exception):
    """The key's limiter state is not where its record (as the caller has it) says: ``moving``
    while a move into that home is still being carried over, else the record is stale."""

    key_id: str
    moving: bool

    def __str__(self) -> str:
        return f"key {self.key_id}: limiter home {'moving' if self.moving else 'moved'}"


@dataclass(frozen=True)
class KeyLimits:
    rpm: int | None = None  # requests per minute (per limiter window)
    tpm: int | None = None  # tokens per minute (per limiter window)
    budget_nanos: int | None = None  # nano-dollars per budget period (gateway/money.py)
    budget_period: BudgetPeriod = "month"
    max_parallel: int | None = None  # requests in flight at once
    budget_soft: bool = False  # a soft budget alerts but never refuses
    alert_thresholds: tuple[int, ...] = ()  # whole percents (1-100) of the budget

    def __post_init__(self) -> None:
        for name in ("rpm", "tpm", "max_parallel"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ValueError(f"{name} must be a non-negative integer or None, got {value!r}")
        if self.budget_nanos is not None:
            _check_nanos(self.budget_nanos, "budget_nanos")
        if self.budget_period not in PERIODS:
            raise ValueError(
                f"budget_period must be one of {', '.join(PERIODS)}, got {self.budget_period!r}"
            )
        if any(not isinstance(t, int) or not 1 <= t <= 100 for t in self.alert_thresholds):
            raise ValueError(
                f"alert_thresholds must be percents 1-100, got {self.alert_thresholds}"
            )


@dataclass(frozen=True)
class Reservation:
    key_id: str
    request_id: str
    tokens: int
    cost_nanos: int
    at: float  # Redis server time (epoch seconds) when the reservation was taken
    budget_window: str | None  # "2025-06-01", "2025-W23", "2025-06" or "total"; None: no budget
    headers: dict[str, str] = field(default_factory=dict)  # x-ratelimit-* for the response
    home: str | None = None  # where the key's state was when reserved (None: its own home)
    in_flight: int = 0  # scopes holding an in-flight lease (bit 1 the key, bit 2 its team)
    # The key's own budget and alert thresholds, for the settle to see which ones it crosses.
    alert_budget_nanos: int | None = None
    alert_thresholds: tuple[int, ...] = ()

    @property
    def team(self) -> str | None:
        return team_of_home(self.home) if self.home else None


@dataclass(slots=True)
class _Ask:
    """One request's reserve in a script call: its reply comes to ``reply`` when the call
    carries several (None: a request alone in its call, which waits on the call itself)."""

    request_id: str
    tokens: int
    nanos: int
    reply: asyncio.Future[Any] | None


@dataclass(frozen=True)
class BudgetCrossing:
    """One alert threshold of a budget that a settle's spend crossed (exactly one settle
    crosses each threshold of each budget window)."""

    scope: Literal["key", "team"]
    scope_id: str  # the key id or the team id
    period: str
    window: str  # "2025-06-01", "2025-W23", "2025-06" or "total"
    threshold: int  # percent of the budget
    spent_nanos: int
    budget_nanos: int


def settle_crossings(reservation: Reservation, reply: Any) -> list[BudgetCrossing]:
    """The alert thresholds the reply of one reservation's settle says it crossed."""
    return settles_crossings([reservation], reply)


def settles_crossings(reservations: Sequence[Reservation], reply: Any) -> list[BudgetCrossing]:
    """The alert thresholds a settle script's reply says its ``reservations`` (in the order
    they were queued) crossed (limits_settle.lua)."""
    if not isinstance(reply, list):
        return []
    out = []
    for at in range(len(reservations), len(reply) - 6, 7):
        item, scope, period, window, threshold, spent, budget = reply[at : at + 7]
        reservation = reservations[int(item) - 1]
        team = int(scope) == 2
        out.append(
            BudgetCrossing(
                scope="team" if team else "key",
                scope_id=(reservation.team or "") if team else reservation.key_id,
                period=_text(period),
                window=_text(window),
                threshold=int(threshold),
                spent_nanos=int(spent),
                budget_nanos=int(budget),
            )
        )
    return out


def settle_applied(reply: Any) -> bool:
    return bool(int(reply[0]) if isinstance(reply, list) else int(reply))


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


# The prelude parts (lua/limits_<part>.lua, after limits_common.lua) each script calls: Redis
# runs a script's whole prelude on every call, so each takes only what it uses.
SCRIPT_PARTS = {
    "limits_reserve.lua": ("windows", "calendar", "holds"),
    "limits_settle.lua": ("windows", "holds"),
    "limits_status.lua": ("windows", "calendar", "holds"),
    "limits_renew.lua": (),
    "limits_move_out.lua": ("holds",),
    "limits_move_in.lua": ("windows", "calendar", "holds"),
    "limits_move_ack.lua": (),
    "limits_move_done.lua": ("holds",),
}


def script_source(name: str) -> str:
    package = resources.files("gateway.metering") / "lua"
    parts = ["common", *SCRIPT_PARTS[name]]
    return (
        "".join((package / f"limits_{part}.lua").read_text() for part in parts)
        + (package / name).read_text()
    )


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
        in_flight_lease_s: float = 30.0,
    ) -> None:
        """``window_s`` is the rate-limit window (60 s: "per minute"), cut into ``buckets``
        sub-buckets; ``lease_s`` is how long a reservation may stay unsettled before its
        budget hold is given back (its holder is presumed dead); ``in_flight_lease_s`` is how
        long an in-flight request counts without this gateway renewing it."""
        window_ms = round(window_s * 1000)
        if buckets < 1 or window_ms < buckets or window_ms % buckets:
            raise ValueError(
                f"window_s={window_s} must be a whole number of ms divisible by buckets={buckets}"
            )
        if lease_s <= 0 or in_flight_lease_s <= 0:
            raise ValueError("lease_s and in_flight_lease_s must be positive")
        self._redis = redis
        self._direct = DirectRedis(redis)  # the per-request calls skip redis-py's pool machinery
        self._prefix = key_prefix
        self.window_ms = window_ms
        self.buckets = buckets
        self.lease_ms = round(lease_s * 1000)
        self.in_flight_lease_ms = round(in_flight_lease_s * 1000)
        self._reserve_lua = LuaScript.of(script_source("limits_reserve.lua"))
        self._settle_lua = LuaScript.of(script_source("limits_settle.lua"))
        self._status_lua = LuaScript.of(script_source("limits_status.lua"))
        self._renew_lua = LuaScript.of(script_source("limits_renew.lua"))
        # Reservations of this gateway holding in-flight leases: request id -> (reservation,
        # monotonic time taken). Renewed until settled or released.
        self._flying: dict[str, tuple[Reservation, float]] = {}
        # Reserves of one key (and record) gathering in this event-loop turn, the first one
        # first: they go to Redis in one script call.
        self._gathering: dict[tuple[str, str | None, int, KeyLimits, int | None], list[_Ask]] = {}
        self._tasks: set[asyncio.Future[Any]] = set()

    # -- key names -------------------------------------------------------------------------

    def keys(self, key_id: str, home: str | None = None) -> list[str]:
        """The Redis keys of one API key's scope, all in one cluster hash slot (order matters):
        under ``{key:<id>}`` for a key of no team, under ``{team:<t>}`` for a key of team t."""
        if not isinstance(key_id, str) or not key_id:
            raise ValueError(f"key_id must be a non-empty string, got {key_id!r}")
        home = home or key_home(key_id)
        base = f"{self._prefix}:{{{home}}}:"
        if team_of_home(home) is not None:
            base += f"key:{key_id}:"
        return [base + part for part in SCOPE_PARTS]

    def team_keys(self, team: str) -> list[str]:
        """The team's own scope, then its record (the script reads the team's limits there)."""
        base = f"{self._prefix}:{{team:{team}}}"
        return [f"{base}:{part}" for part in SCOPE_PARTS] + [base]

    def reservation_keys(self, key_id: str, home: str | None) -> list[str]:
        """Every scope a reservation of this key at ``home`` touches (the record left out)."""
        keys = self.keys(key_id, home)
        team = team_of_home(home) if home else None
        if team is not None:
            keys += self.team_keys(team)[: len(SCOPE_PARTS)]
        return keys

    # -- reserve, settle, release --------------------------------------------------------

    async def reserve(
        self,
        key_id: str,
        limits: KeyLimits,
        *,
        tokens: int,
        cost_nanos: int,
        request_id: str,
        home: str | None = None,
        epoch: int = 0,
        hold_ms: int | None = None,
    ) -> Reservation:
        """Take 1 request, ``tokens`` tokens, ``cost_nanos`` nano-dollars of budget and an
        in-flight slot in the key's scope and in its team's, or raise RateLimited (see
        docs/limits.md for the admission rule). ``home`` and ``epoch`` come from the key's
        record; ``HomeChanged`` says the record is out of date or the key is changing teams.

        ``hold_ms``: a budget hold instead, for work that runs elsewhere for hours (a
        provider's batch): only the budgets are checked and held, for ``hold_ms``; no request,
        tokens or in-flight slot is taken, and its settle charges the money only.
        ``AlreadyHeld``: the request id holds one already.

        The reserves of one key that start in the same event-loop turn go to Redis in one
        script call, checked one after the other as separate calls would be."""
        nanos = _lua_nanos(cost_nanos)
        _check_tokens(tokens)
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        group = (key_id, home, epoch, limits, hold_ms)
        gathering = self._gathering.get(group)
        if gathering is not None:  # a reserve of this key is gathering this turn: join it
            ask = _Ask(request_id, tokens, nanos, asyncio.get_running_loop().create_future())
            gathering.append(ask)
            reply = await ask.reply  # type: ignore[misc]
        else:
            asks = [_Ask(request_id, tokens, nanos, None)]
            self._gathering[group] = asks
            try:
                await asyncio.sleep(0)  # the other requests of this turn join
            except asyncio.CancelledError:
                if len(asks) > 1:  # they go without this one
                    self._spawn(self._send_reserves(key_id, limits, home, epoch, hold_ms, asks[1:]))
                raise
            finally:
                del self._gathering[group]
            if len(asks) == 1:
                reply = (await self._call_reserve(key_id, limits, home, epoch, hold_ms, asks))[0]
            else:  # its own task: a client gone while it runs must not fail the others'
                # Its reply comes as the others' do: a future the task sets is a loop turn
                # sooner than the task's own end seen through a shield.
                mine = asks[0].reply = asyncio.get_running_loop().create_future()
                self._spawn(self._send_reserves(key_id, limits, home, epoch, hold_ms, asks))
                reply = await mine
        return self._reservation(reply, key_id, limits, home, request_id, tokens, cost_nanos)

    async def _send_reserves(
        self,
        key_id: str,
        limits: KeyLimits,
        home: str | None,
        epoch: int,
        hold_ms: int | None,
        asks: list[_Ask],
    ) -> None:
        """One script call for ``asks``, each reply to its ask's future (a request that left
        has cancelled its own, which is skipped)."""
        try:
            replies = await self._call_reserve(key_id, limits, home, epoch, hold_ms, asks)
        except BaseException as exc:
            for ask in asks:
                if ask.reply is not None and not ask.reply.done():
                    ask.reply.set_exception(exc)
            raise
        for ask, reply in zip(asks, replies, strict=True):
            if ask.reply is not None and not ask.reply.done():
                ask.reply.set_result(reply)

    async def _call_reserve(
        self,
        key_id: str,
        limits: KeyLimits,
        home: str | None,
        epoch: int,
        hold_ms: int | None,
        asks: list[_Ask],
    ) -> list[Any]:
        keys = self.keys(key_id, home)
        team = team_of_home(home) if home else None
        if team is not None:
            keys += self.team_keys(team)
        args: list[Any] = [
            self.window_ms,
            self.buckets,
            self.lease_ms if hold_ms is None else hold_ms,
            self.in_flight_lease_ms,
            epoch,
            -1 if limits.rpm is None else limits.rpm,
            -1 if limits.tpm is None else limits.tpm,
            -1 if limits.budget_nanos is None else limits.budget_nanos,
            limits.budget_period,
            -1 if limits.max_parallel is None else limits.max_parallel,
            1 if limits.budget_soft else 0,
            0 if hold_ms is None else 1,
        ]
        for ask in asks:
            args += (ask.request_id, ask.tokens, ask.nanos)
        return await self._call(self._reserve_lua, keys, args)

    def _reservation(
        self,
        reply: Any,
        key_id: str,
        limits: KeyLimits,
        home: str | None,
        request_id: str,
        tokens: int,
        cost_nanos: int,
    ) -> Reservation:
        """One request's reply of the reserve script as its reservation, or the refusal."""

        def asked(**taken: Any) -> Reservation:
            """What the request asked for, with what the reply says the script took."""
            return Reservation(
                key_id=key_id,
                request_id=request_id,
                tokens=tokens,
                cost_nanos=_lua_nanos(cost_nanos),
                home=home,
                alert_budget_nanos=limits.budget_nanos if limits.alert_thresholds else None,
                alert_thresholds=limits.alert_thresholds,
                **taken,
            )

        status = int(reply[0])
        if status == -1:
            raise AlreadyHeld(asked(at=0.0, budget_window=None))
        if status in (-2, -3):
            raise HomeChanged(key_id, moving=status == -3)
        if status == 0:
            team = team_of_home(home) if home else None
            raise refusal(
                reply, team=team, tokens=tokens, cost_nanos=cost_nanos, window_ms=self.window_ms
            )
        reservation = asked(
            at=int(reply[1]) / 1000,
            budget_window=_text(reply[2]) or None,
            headers=rate_headers(reply[4:]),
            in_flight=int(reply[3]),
        )
        if reservation.in_flight:
            self._flying[request_id] = (reservation, time.monotonic())
        return reservation

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
        """A task kept until done; its failure, when nobody awaits it any more (the requests
        were told through their futures), is not reported again."""
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(_forget)
        task.add_done_callback(self._tasks.discard)
        return task

    def queue_settle(
        self, batch: ScriptBatch, reservation: Reservation, *, tokens: int, cost_nanos: int
    ) -> int:
        """Queue the settle on a ``ScriptBatch`` (EVALSHA, shares its round trip); returns the
        position of its reply. The batch recovers from NOSCRIPT itself."""
        keys, args = self._settle_call(reservation, "settle", tokens, cost_nanos)
        return batch.call(self._settle_lua, keys, args)

    def queue_settles(
        self, batch: ScriptBatch, settles: Sequence[tuple[Reservation, int, int]]
    ) -> list[tuple[int, list[Reservation]]]:
        """Queue the settles of many reservations (each with the tokens and nano-dollars it
        used), one script run per key with its reservations in order; returns each run's reply
        position and reservations, for ``settles_crossings``. The hot path's way: a burst of
        one key's requests settles in one script."""
        runs: dict[tuple[str, str | None], tuple[list[str], list[Any], list[Reservation]]] = {}
        for held, tokens, cost_nanos in settles:
            run = runs.get((held.key_id, held.home))
            if run is None:
                keys, args = self._settle_call(held, "settle", tokens, cost_nanos)
                runs[(held.key_id, held.home)] = (keys, args, [held])
            else:
                run[1].extend(self._settle_item(held, "settle", tokens, cost_nanos))
                run[2].append(held)
        return [
            (batch.call(self._settle_lua, keys, args), held) for keys, args, held in runs.values()
        ]

    def queue_release(self, batch: ScriptBatch, reservation: Reservation) -> int:
        """Queue a release on a ``ScriptBatch`` (a spooled one, replayed); returns its reply's
        position."""
        keys, args = self._settle_call(reservation, "release", 0, 0)
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
        return settle_applied(await self._call(self._settle_lua, keys, args))

    async def release(self, reservation: Reservation) -> bool:
        """The request never reached a provider: give back the request, tokens and budget."""
        keys, args = self._settle_call(reservation, "release", 0, 0)
        return settle_applied(await self._call(self._settle_lua, keys, args))

    def _settle_call(
        self, reservation: Reservation, mode: str, tokens: int, cost_nanos: int
    ) -> tuple[list[str], list[Any]]:
        keys = self.reservation_keys(reservation.key_id, reservation.home)
        if reservation.team is not None:
            keys.append(self.team_keys(reservation.team)[-1])  # its budgets and thresholds
        args = [self.window_ms, self.buckets]
        return keys, [*args, *self._settle_item(reservation, mode, tokens, cost_nanos)]

    def _settle_item(
        self, reservation: Reservation, mode: str, tokens: int, cost_nanos: int
    ) -> list[Any]:
        """One reservation's arguments of the settle script."""
        _check_tokens(tokens)
        nanos = _lua_nanos(cost_nanos)
        self._flying.pop(reservation.request_id, None)  # its in-flight leases end with it
        budget = reservation.alert_budget_nanos
        thresholds = ",".join(str(t) for t in reservation.alert_thresholds) or "-"
        return [
            reservation.request_id,
            mode,
            tokens,
            nanos,
            -1 if budget is None else budget,
            thresholds,
        ]

    # -- in-flight leases ----------------------------------------------------------------

    @property
    def flying(self) -> int:
        """Reservations of this gateway whose in-flight leases it renews."""
        return len(self._flying)

    async def renew_in_flight(self) -> int:
        """Extend the in-flight leases of this gateway's running requests (one round trip);
        returns how many leases were renewed. A reservation older than the budget lease is
        dropped: its request cannot still be running."""
        oldest = time.monotonic() - self.lease_ms / 1000
        by_key: dict[str, list[str]] = {}
        for request_id, (held, taken) in list(self._flying.items()):
            if taken < oldest:
                del self._flying[request_id]
                continue
            if held.in_flight & _KEY_SCOPE:
                by_key.setdefault(self.keys(held.key_id, held.home)[8], []).append(request_id)
            team = held.team
            if held.in_flight & _TEAM_SCOPE and team is not None:
                by_key.setdefault(self.team_keys(team)[8], []).append(request_id)
        if not by_key:
            return 0
        batch = ScriptBatch()
        ttl = 2 * self.in_flight_lease_ms + self.window_ms
        for key, request_ids in by_key.items():
            batch.call(self._renew_lua, [key], [self.in_flight_lease_ms, ttl, *request_ids])
        try:
            return sum(int(n) for n in await batch.execute(self._direct))
        except _UNAVAILABLE_ERRORS as exc:
            raise LimiterUnavailable(f"lease renewal failed: {type(exc).__name__}") from exc

    async def forget_team(self, team: str) -> None:
        """Drop a deleted team's own counters (a team made later with its id starts afresh)."""
        await self._redis.delete(*self.team_keys(team)[: len(SCOPE_PARTS)])

    # -- status --------------------------------------------------------------------------

    async def status(
        self, key_id: str, limits: KeyLimits, home: str | None = None
    ) -> dict[str, Any]:
        """Usage and what is left in the current windows of one key, for admin views."""
        scope = await self._scope_status(self.keys(key_id, home))
        budget = self._budget_view(scope, limits.budget_period, limits.budget_nanos)
        return {
            "key_id": key_id,
            "at": scope["at"],
            "window_s": self.window_ms / 1000,
            "requests": _window_view(limits.rpm, *scope["requests"]),
            "tokens": _window_view(limits.tpm, *scope["tokens"]),
            "budget": budget,
            "in_flight": scope["holds"],
            "parallel": {"limit": limits.max_parallel, "in_flight": scope["in_flight"]},
        }

    async def team_status(
        self,
        team: str,
        *,
        rpm: int | None,
        tpm: int | None,
        budgets_nanos: dict[str, int],
        max_parallel: int | None,
    ) -> dict[str, Any]:
        """A team's usage against its limits (what its keys share)."""
        scope = await self._scope_status(self.team_keys(team)[: len(SCOPE_PARTS)])
        return {
            "team": team,
            "at": scope["at"],
            "window_s": self.window_ms / 1000,
            "requests": _window_view(rpm, *scope["requests"]),
            "tokens": _window_view(tpm, *scope["tokens"]),
            "budgets": {
                period: self._budget_view(scope, period, budgets_nanos[period])
                for period in PERIODS
                if period in budgets_nanos
            },
            "parallel": {"limit": max_parallel, "in_flight": scope["in_flight"]},
        }

    async def _scope_status(self, keys: list[str]) -> dict[str, Any]:
        reply = await self._call(self._status_lua, keys, [self.window_ms, self.buckets])
        now_ms, rpm_used, tpm_used, rpm_reset, tpm_reset, holds, flying = (
            int(v) for v in reply[:7]
        )
        budgets = {}
        for index, period in enumerate(PERIODS):
            window, end, spent, held = reply[7 + 4 * index : 11 + 4 * index]
            budgets[period] = (_text(window), int(end), int(spent), int(held))
        return {
            "at": now_ms / 1000,
            "requests": (rpm_used, rpm_reset),
            "tokens": (tpm_used, tpm_reset),
            "holds": holds,
            "in_flight": flying,
            "budgets": budgets,
        }

    @staticmethod
    def _budget_view(scope: dict[str, Any], period: str, limit: int | None) -> dict[str, Any]:
        window, window_end, spent, held = scope["budgets"][period]
        remaining = None if limit is None else max(0, limit - spent - held)
        now_ms = scope["at"] * 1000
        return {
            "period": period,
            "window": window,
            "limit_nanos": limit,
            "spent_nanos": spent,
            "reserved_nanos": held,
            "remaining_nanos": remaining,
            # float renderings of the integers above, for people
            "limit_usd": None if limit is None else nanos_to_usd(limit),
            "spent_usd": nanos_to_usd(spent),
            "reserved_usd": nanos_to_usd(held),
            "remaining_usd": None if remaining is None else nanos_to_usd(remaining),
            "resets_in_s": None if window_end < 0 else (window_end - now_ms) / 1000,
        }

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


def _forget(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _window_view(limit: int | None, used: int, reset_ms: int) -> dict[str, Any]:
    return {
        "limit": limit,
        "used": used,
        "remaining": None if limit is None else max(0, limit - used),
        "reset_s": reset_ms / 1000,
    }
