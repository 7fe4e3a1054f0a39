"""The usage event as the SQL store keeps it: ``LedgerEvent``, validated on construction.

One answered request is one event, identified by its usage id (``event_id``). Time is integer
epoch milliseconds (exact, and a clean pagination cursor); the UTC day it falls on is the
partition and rollup day. Cost is integer nano-dollars. ``end_user`` and ``tags`` carry the
attribution of issue 18. Every field is checked here, so a bad event is refused with a
``LedgerError`` naming the field before it reaches a database (PostgreSQL text cannot even hold
a NUL).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime

from gateway.ledger.record import (
    JsonRecord,
    RecordError,
    check_id,
    check_label,
    check_outcome,
)

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


class LedgerError(RecordError):
    """An event the store refuses; ``field`` names the offending attribute."""


def day_number(time_ms: int) -> int:
    """Days since 1970-01-01 (UTC) of an epoch-milliseconds time."""
    return time_ms // MS_PER_DAY


def day_of_ms(time_ms: int) -> date:
    return datetime.fromtimestamp(time_ms / 1000, UTC).date()


def _check_int(field: str, value: object, upper: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= upper:
        raise LedgerError(field, f"must be an integer from 0 to {upper}")


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
    """A stored tag (``tag_problem``); ``LedgerError`` naming ``tags``."""
    problem = tag_problem(tag)
    if problem is not None:
        raise LedgerError("tags", problem)


@dataclass(frozen=True, slots=True)
class LedgerEvent(JsonRecord):
    """One request's usage, as stored. ``cost_nanos`` is exact integer nano-dollars."""

    error = LedgerError

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
    cache_write_tokens: int = 0
    cost_nanos: int = 0
    status: int = 200
    streamed: bool = False
    usage_source: str = "provider"
    attempts: int = 1
    latency_ms: int = 0
    ttft_ms: int | None = None
    policy_version: str = ""
    end_user: str = ""
    tags: tuple[str, ...] = ()
    # The price catalogue its cost came from ("genai-prices 0.2.3"); "" = the policy's price.
    price_catalogue: str = ""

    def __post_init__(self) -> None:
        check_id(LedgerError, "event_id", self.event_id)
        if isinstance(self.time_ms, bool) or not isinstance(self.time_ms, int):
            raise LedgerError("time_ms", "must be integer epoch milliseconds")
        if not MIN_TIME_MS <= self.time_ms < MAX_TIME_MS:
            raise LedgerError("time_ms", "out of range (epoch milliseconds expected)")
        check_id(LedgerError, "key_id", self.key_id)
        for name in (
            "model",
            "provider",
            "team",
            "task",
            "route",
            "policy_version",
            "end_user",
            "price_catalogue",
        ):
            check_label(LedgerError, name, getattr(self, name))
        for name in ("prompt_tokens", "completion_tokens", "cached_tokens", "cache_write_tokens"):
            _check_int(name, getattr(self, name), MAX_TOKENS)
        if self.cached_tokens > self.prompt_tokens:
            raise LedgerError("cached_tokens", "exceeds prompt_tokens")
        _check_int("cost_nanos", self.cost_nanos, MAX_COST_NANOS)
        check_outcome(LedgerError, self.status, self.streamed, self.usage_source)
        _check_int("attempts", self.attempts, 1000)
        _check_int("latency_ms", self.latency_ms, MAX_MILLIS)
        if self.ttft_ms is not None:
            _check_int("ttft_ms", self.ttft_ms, MAX_MILLIS)
        self._check_tags()

    def _check_tags(self) -> None:
        tags = self.tags
        if isinstance(tags, list):  # JSON gives lists; keep the record immutable
            tags = tuple(tags)
            object.__setattr__(self, "tags", tags)
        if not isinstance(tags, tuple):
            raise LedgerError("tags", "must be a list of strings")
        if len(tags) > MAX_TAGS:
            raise LedgerError("tags", f"at most {MAX_TAGS} tags")
        for tag in tags:
            check_tag(tag)
        # A repeated tag would count the request twice in that tag's totals.
        if len(set(tags)) != len(tags):
            raise LedgerError("tags", "a tag is repeated")

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
