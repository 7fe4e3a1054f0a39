"""The usage event: ``UsageEvent``, one per request, from the request's end to the SQL store.

One request is one event, identified by its usage id (``event_id``). Time is integer epoch
milliseconds (exact, and a clean pagination cursor); the UTC day it falls on is the partition
and rollup day. Cost is integer nano-dollars. ``end_user`` and ``tags`` carry the attribution of
issue 18. The metering part builds it when a request ends and records it (Redis buffer, spool);
the exporter moves it into the SQL store, which keeps it field for field (``tables.py``).

Checks come in two levels, so that nothing is lost to the bound of a column:

* on construction, what every event must be (types, ids, counts that add up): a request whose
  event fails these has nothing to record;
* ``check_storable``, the store's own bounds (printable labels, 64-bit sums, the tag rule): an
  event recorded but past them is kept apart as a dead letter, to be corrected and replayed,
  and the store refuses it with a ``UsageError`` naming the field before it reaches a database
  (PostgreSQL text cannot even hold a NUL).

Its JSON (``to_json``/``from_json``) is the form it has in the Redis buffer, the usage spool
and old per-key streams, unchanged since before the SQL store: ``request_id`` for the id, and
``time`` in epoch seconds; ``from_dict`` also reads ``cost_micros`` (before nano-dollars).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

import orjson

from gateway.ledger.record import (
    MAX_ID_LENGTH,
    JsonRecord,
    RecordError,
    build_strictly,
    check_id,
    check_label,
    check_outcome,
)
from gateway.money import NANOS_PER_MICRO, nanos_to_usd

MAX_TAGS = 8
MAX_TAG_LENGTH = 64
TAG_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/=@")
# Bounds keep every sum inside a signed 64-bit column for any realistic number of events.
MAX_TOKENS = 2**40
MAX_COST_NANOS = 10**18  # one billion dollars for one request
MAX_MILLIS = 2**31 - 1  # latency and time to first token
MAX_TIME_MS = 10**14  # year 5138; epoch seconds passed by mistake are caught below
MIN_TIME_MS = 10**12  # 2001-09-09
MS_PER_DAY = 86_400_000
EPOCH_DAY = date(1970, 1, 1)


# A counter kept in Redis (the limiter's spend) is a signed 64-bit integer.
MAX_REDIS_COUNTER = 2**63 - 1
# The JSON form's names for the two fields the store names otherwise.
JSON_NAMES = {"event_id": "request_id", "time_ms": "time"}


class UsageError(RecordError):
    """An event refused; ``field`` names the offending attribute."""


def day_number(time_ms: int) -> int:
    """Days since 1970-01-01 (UTC) of an epoch-milliseconds time."""
    return time_ms // MS_PER_DAY


def day_of_ms(time_ms: int) -> date:
    return datetime.fromtimestamp(time_ms / 1000, UTC).date()


def day_of(epoch_s: float) -> date:
    return datetime.fromtimestamp(epoch_s, UTC).date()


def _check_count(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(field, "must be a non-negative integer")


def _check_bound(field: str, value: int, upper: int) -> None:
    if value > upper:
        raise UsageError(field, f"must be an integer from 0 to {upper}")


def tag_problem(tag: object) -> str | None:
    """Why ``tag`` cannot be a tag (1 to MAX_TAG_LENGTH characters of letters, digits and
    ``- _ . : / = @``), or None: the one tag rule, for the ledger and every entry point."""
    if not isinstance(tag, str) or not 1 <= len(tag) <= MAX_TAG_LENGTH:
        return f"each tag must be a string of 1 to {MAX_TAG_LENGTH} characters"
    if not TAG_CHARS.issuperset(tag):
        return f"tag {tag[:MAX_TAG_LENGTH]!r} may hold only letters, digits and - _ . : / = @"
    return None


def clean_tags(values: Sequence[object], field: str) -> tuple[str, ...]:
    """Tags as stored: each checked, repeats dropped, order kept. ``ValueError`` names
    ``field``."""
    tags: list[str] = []
    for value in values:
        tag = value.strip() if isinstance(value, str) else value
        problem = tag_problem(tag)
        if problem is not None:
            raise ValueError(f"{field}: {problem}")
        assert isinstance(tag, str)
        if tag not in tags:
            tags.append(tag)
    if len(tags) > MAX_TAGS:
        raise ValueError(f"{field}: at most {MAX_TAGS} tags, got {len(tags)}")
    return tuple(tags)


def check_tag(tag: object) -> None:
    """A stored tag (``tag_problem``); ``UsageError`` naming ``tags``."""
    problem = tag_problem(tag)
    if problem is not None:
        raise UsageError("tags", problem)


# The event's free-text labels: each a bounded string, printable once stored.
LABELS = (
    "model",
    "provider",
    "team",
    "task",
    "route",
    "policy_version",
    "end_user",
    "price_catalogue",
)


@dataclass(frozen=True, slots=True)
class UsageEvent(JsonRecord):
    """One request's usage. ``cost_nanos`` is exact integer nano-dollars. The fields are in
    the column order of the store's ``usage_events`` (``tables.EVENT_SELECT``)."""

    error = UsageError

    event_id: str
    time_ms: int
    key_id: str
    model: str
    provider: str
    team: str = ""
    task: str = ""
    route: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # Of prompt_tokens, those written to a provider's prompt cache (Anthropic), priced apart.
    cache_write_tokens: int = 0
    cost_nanos: int = 0
    status: int = 200
    streamed: bool = False
    usage_source: str = "provider"
    attempts: int = 1
    latency_ms: int = 0
    ttft_ms: int | None = None
    policy_version: str = ""
    # Attribution (gateway/metering/attribution.py): the end user and the request's tags.
    end_user: str = ""
    tags: tuple[str, ...] = ()
    # The price catalogue its cost came from ("genai-prices 0.2.3"); "" = the policy's price.
    price_catalogue: str = ""

    def __post_init__(self) -> None:
        check_id(UsageError, "event_id", self.event_id)
        if isinstance(self.time_ms, bool) or not isinstance(self.time_ms, int):
            raise UsageError("time_ms", "must be integer epoch milliseconds")
        if not 0 < self.time_ms < MAX_TIME_MS:
            raise UsageError("time_ms", "out of range (epoch milliseconds expected)")
        check_id(UsageError, "key_id", self.key_id)
        for name in LABELS:
            value = getattr(self, name)
            if not isinstance(value, str) or len(value) > MAX_ID_LENGTH:
                raise UsageError(name, f"must be a string of at most {MAX_ID_LENGTH} characters")
        for name in (
            "prompt_tokens",
            "completion_tokens",
            "cached_tokens",
            "cache_write_tokens",
            "latency_ms",
        ):
            _check_count(name, getattr(self, name))
        if self.ttft_ms is not None:
            _check_count("ttft_ms", self.ttft_ms)
        if self.cached_tokens > self.prompt_tokens:
            raise UsageError("cached_tokens", "exceeds prompt_tokens")
        if self.cached_tokens + self.cache_write_tokens > self.prompt_tokens:
            raise UsageError("cache_write_tokens", "with cached_tokens, exceeds prompt_tokens")
        check_outcome(UsageError, self.status, self.streamed, self.usage_source)
        _check_count("attempts", self.attempts)
        if isinstance(self.tags, list):  # JSON gives lists; the record stays immutable
            object.__setattr__(self, "tags", tuple(self.tags))
        if not isinstance(self.tags, tuple) or not all(isinstance(t, str) for t in self.tags):
            raise UsageError("tags", "must be a list of strings")
        _check_count("cost_nanos", self.cost_nanos)
        if self.cost_nanos > MAX_REDIS_COUNTER:
            raise UsageError("cost_nanos", "exceeds a 64-bit Redis counter")

    def check_storable(self) -> None:
        """Raise ``UsageError`` naming the first field past the store's bounds: sums that fit
        a signed 64-bit column for any realistic number of events, printable labels, the tag
        rule, a time after 2001 (epoch seconds passed by mistake)."""
        if self.time_ms < MIN_TIME_MS:
            raise UsageError("time_ms", "out of range (epoch milliseconds expected)")
        for name in LABELS:
            check_label(UsageError, name, getattr(self, name))
        for name in ("prompt_tokens", "completion_tokens", "cached_tokens", "cache_write_tokens"):
            _check_bound(name, getattr(self, name), MAX_TOKENS)
        _check_bound("cost_nanos", self.cost_nanos, MAX_COST_NANOS)
        _check_bound("attempts", self.attempts, 1000)
        _check_bound("latency_ms", self.latency_ms, MAX_MILLIS)
        if self.ttft_ms is not None:
            _check_bound("ttft_ms", self.ttft_ms, MAX_MILLIS)
        if len(self.tags) > MAX_TAGS:
            raise UsageError("tags", f"at most {MAX_TAGS} tags")
        for tag in self.tags:
            check_tag(tag)
        # A repeated tag would count the request twice in that tag's totals.
        if len(set(self.tags)) != len(self.tags):
            raise UsageError("tags", "a tag is repeated")

    @property
    def day(self) -> date:
        return day_of_ms(self.time_ms)

    @property
    def day_number(self) -> int:
        return day_number(self.time_ms)

    @property
    def is_error(self) -> bool:
        return self.status >= 400

    @property
    def estimated(self) -> bool:
        return self.usage_source == "estimated"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def cost_usd(self) -> float:
        """The float rendering of ``cost_nanos`` (which stays the exact figure)."""
        return nanos_to_usd(self.cost_nanos)

    def to_dict(self) -> dict[str, Any]:
        """The event's JSON form, key for key as every version wrote it. ``time`` is the middle
        of the event's millisecond, so that any reader's ``int(time * 1000)`` gets the same
        millisecond back (``time_ms / 1000`` would, for some values, read as one less)."""
        return {
            "time": (self.time_ms + 0.5) / 1000,
            "request_id": self.event_id,
            "key_id": self.key_id,
            "model": self.model,
            "provider": self.provider,
            "team": self.team,
            "task": self.task,
            "route": self.route,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "cost_nanos": self.cost_nanos,
            "cost_usd": self.cost_usd,
            "cache_write_tokens": self.cache_write_tokens,
            "policy_version": self.policy_version,
            "latency_ms": self.latency_ms,
            "ttft_ms": self.ttft_ms,
            "status": self.status,
            "streamed": self.streamed,
            "usage_source": self.usage_source,
            "attempts": self.attempts,
            "end_user": self.end_user,
            "tags": list(self.tags),
        }

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UsageEvent:
        """The event of a JSON form written by any version; ``UsageError`` names the field in
        the JSON's own terms (``request_id``, ``time``)."""
        fields = _current_fields(data)
        try:
            return build_strictly(cls, fields)
        except UsageError as exc:
            if exc.field not in JSON_NAMES:
                raise
            message = str(exc).removeprefix(f"{exc.field}: ")
            raise UsageError(JSON_NAMES[exc.field], message) from None


def _current_fields(data: dict[str, Any]) -> dict[str, Any]:
    """A JSON form's fields under the event's names: ``request_id`` is ``event_id``, ``time``
    (epoch seconds) whole milliseconds, the same way for every copy of an event, so a
    re-delivered copy meets the first one on the same day; ``cost_micros`` (events and spool
    lines from before nano-dollars) becomes ``cost_nanos``; ``cost_usd`` is re-derived."""
    fields = dict(data)
    for name in JSON_NAMES:
        if name in fields:  # the JSON form names them otherwise
            raise UsageError(name, "unknown field")
    if "request_id" in fields:
        fields["event_id"] = fields.pop("request_id")
    if "time" in fields:
        seconds = fields.pop("time")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise UsageError("time", "must be epoch seconds")
        if not 0 < seconds < MAX_TIME_MS / 1000:
            raise UsageError("time", "out of range")
        fields["time_ms"] = int(seconds * 1000)
    fields.pop("cost_usd", None)
    micros = fields.pop("cost_micros", None)
    if micros is not None and "cost_nanos" not in fields:
        _check_count("cost_micros", micros)
        fields["cost_nanos"] = micros * NANOS_PER_MICRO
    return fields
