"""Teams on Redis: the team record, and where a key's limiter state lives (its home).

A team is ``sy:{team:<id>}``, a hash of its limits (rpm, tpm, max_parallel_requests, a
budget in nano-dollars per period, its budget mode and alert thresholds), listed in ``sy:teams:index`` by creation. The record sits
in the team's own hash slot, beside the limiter state of the team and of every key in it, so
the limiter's reserve script reads the team's limits and checks the key and its team in one
atomic step, on one Redis or on one Cluster node (docs/limits.md).

A key's *home* names the hash tag of its limiter state: ``key:<id>`` (a key of no team, and
every key made before teams existed) or ``team:<team id>``. It changes only when the key joins
or leaves a team; ``gateway.metering.moves`` carries its counters along.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from redis.asyncio import Redis

from gateway.money import nanos_to_usd
from gateway.store.hash_fields import WRITE_FIELDS_LUA
from gateway.store.index import index_page

TEAM_INDEX_KEY = "sy:teams:index"
TEAM_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_TEAM_ID = re.compile(TEAM_ID_PATTERN)
BUDGET_PERIODS = ("day", "week", "month", "total")
_INT_FIELDS = (
    "rpm",
    "tpm",
    "max_parallel_requests",
    *(f"budget_{period}_nanos" for period in BUDGET_PERIODS),
)
_FLOAT_FIELDS = ("created_at", "updated_at")


def is_team_id(value: str) -> bool:
    return bool(_TEAM_ID.match(value))


def team_record_key(team_id: str) -> str:
    return f"sy:{{team:{team_id}}}"


def key_home(key_id: str) -> str:
    return f"key:{key_id}"


def team_home(team_id: str) -> str:
    return f"team:{team_id}"


def team_of_home(home: str) -> str | None:
    """The team whose slot holds this home, or None for a key's own home."""
    return home.removeprefix("team:") if home.startswith("team:") else None


class TeamView(TypedDict):
    """A team as the admin API shows it (``TeamRecord.public_view``)."""

    id: str
    object: Literal["team"]
    name: str | None
    rpm: int | None
    tpm: int | None
    max_parallel_requests: int | None
    budgets_usd: dict[str, float]
    budgets_nanos: dict[str, int]
    budget_mode: Literal["hard", "soft"]
    alert_thresholds: list[int]
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class TeamRecord:
    id: str
    created_at: float
    updated_at: float
    name: str | None = None
    rpm: int | None = None
    tpm: int | None = None
    max_parallel_requests: int | None = None
    # nano-dollars per period ("day", "week", "month", "total"); a period not here is unlimited
    budgets_nanos: dict[str, int] = field(default_factory=dict)
    budget_mode: str | None = None  # soft: its budgets alert but never refuse
    alert_thresholds: tuple[int, ...] = ()  # percents of each budget (webhooks)

    def public_view(self) -> TeamView:
        return {
            "id": self.id,
            "object": "team",
            "name": self.name,
            "rpm": self.rpm,
            "tpm": self.tpm,
            "max_parallel_requests": self.max_parallel_requests,
            "budgets_usd": {
                period: nanos_to_usd(self.budgets_nanos[period])
                for period in BUDGET_PERIODS
                if period in self.budgets_nanos
            },
            "budgets_nanos": {
                period: self.budgets_nanos[period]
                for period in BUDGET_PERIODS
                if period in self.budgets_nanos
            },
            "budget_mode": self.budget_mode or "hard",
            "alert_thresholds": list(self.alert_thresholds),
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


def _decode(raw: dict[bytes, bytes]) -> TeamRecord:
    values: dict[str, Any] = {}
    budgets: dict[str, int] = {}
    for name_bytes, value_bytes in raw.items():
        name = name_bytes.decode()
        if name.startswith("budget_") and name.endswith("_nanos"):
            budgets[name.removeprefix("budget_").removesuffix("_nanos")] = int(value_bytes)
        elif name in _INT_FIELDS:
            values[name] = int(value_bytes)
        elif name in _FLOAT_FIELDS:
            values[name] = float(value_bytes)
        elif name in ("id", "name", "budget_mode"):
            values[name] = value_bytes.decode()
        elif name == "alert_thresholds":
            text = value_bytes.decode()
            values[name] = tuple(int(t) for t in text.split(",")) if text else ()
    return TeamRecord(budgets_nanos=budgets, **values)


def stored_fields(changes: dict[str, Any]) -> dict[str, Any]:
    """Team fields as the record keeps them: one ``budget_<period>_nanos`` field per budget."""
    flat: dict[str, Any] = {}
    for name, value in changes.items():
        if name == "budgets_nanos":
            for period in BUDGET_PERIODS:
                if period in value:
                    flat[f"budget_{period}_nanos"] = value[period]
        elif name == "alert_thresholds" and value is not None:
            # comma text: the limiter's settle script reads it from the record
            flat[name] = ",".join(str(t) for t in value) or None
        else:
            flat[name] = value
    return flat


# ARGV: 1 '1' = create (refuse if it exists) or '0' = update (refuse if it does not), 2 count of
# field/value pairs, the pairs, then the fields to delete.
_WRITE = (
    WRITE_FIELDS_LUA
    + """
local exists = redis.call('EXISTS', KEYS[1]) == 1
if (ARGV[1] == '1') == exists then return 0 end
write_fields(2)
return 1
"""
)


class TeamStore:
    """Team records: create, get, list, update, delete. Limits take effect on the next
    reserve on every replica: the limiter reads them from the record itself."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._write = redis.register_script(_WRITE)

    async def get(self, team_id: str) -> TeamRecord | None:
        raw = await self.redis.hgetall(team_record_key(team_id))
        return _decode(raw) if raw else None

    async def exists(self, team_id: str) -> bool:
        return is_team_id(team_id) and bool(await self.redis.exists(team_record_key(team_id)))

    async def create(self, team_id: str, fields: dict[str, Any]) -> TeamRecord | None:
        """The new team; None when one with this id exists already."""
        now = time.time()
        values = {"id": team_id, "created_at": now, "updated_at": now}
        values |= {k: v for k, v in stored_fields(fields).items() if v is not None}
        pairs = [part for name, value in values.items() for part in (name, _text(value))]
        if not await self._write(
            keys=[team_record_key(team_id)], args=["1", len(pairs) // 2, *pairs]
        ):
            return None
        await self.redis.zadd(TEAM_INDEX_KEY, {team_id: now})
        return await self.get(team_id)

    async def update(self, team_id: str, changes: dict[str, Any]) -> TeamRecord | None:
        """Set the given fields; a None value clears one (``budgets_nanos`` per period)."""
        flat = stored_fields(changes) | {"updated_at": time.time()}
        if "budgets_nanos" in changes:  # the budgets given replace the ones there were
            for period in BUDGET_PERIODS:
                flat.setdefault(f"budget_{period}_nanos", None)
        pairs = [
            p for name, value in flat.items() if value is not None for p in (name, _text(value))
        ]
        cleared = [name for name, value in flat.items() if value is None]
        found = await self._write(
            keys=[team_record_key(team_id)], args=["0", len(pairs) // 2, *pairs, *cleared]
        )
        return await self.get(team_id) if found else None

    async def delete(self, team_id: str) -> bool:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.delete(team_record_key(team_id))
            pipe.zrem(TEAM_INDEX_KEY, team_id)
            deleted, _ = await pipe.execute()
        return bool(deleted)

    async def list(
        self, *, limit: int = 100, after: str | None = None
    ) -> tuple[list[TeamRecord], bool]:
        """Teams in creation order, ``limit`` at a time from after the id ``after``."""
        raws, more = await index_page(
            self.redis, TEAM_INDEX_KEY, team_record_key, limit=limit, after=after
        )
        return [_decode(raw) for raw in raws], more


def _text(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)
