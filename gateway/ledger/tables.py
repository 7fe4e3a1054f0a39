"""The table layout both SQL backends share: event columns, rollup tables, the event SELECT.

Each backend writes its own DDL and statements (column types, partitions and placeholders
differ); what is named here is what they must agree on, so that one set of tests proves both.
``EVENT_COLUMNS`` is the column order of ``usage_events`` and of every row a backend writes;
``EVENT_SELECT`` reads the columns back in ``LedgerEvent`` field order, so a row (once its
values are Python types again) is ``LedgerEvent(*row)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gateway.ledger.event import LedgerEvent

EVENT_COLUMNS = (
    "day",
    "event_id",
    "time_ms",
    "key_id",
    "team",
    "model",
    "provider",
    "task",
    "route",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "cost_nanos",
    "status",
    "streamed",
    "usage_source",
    "attempts",
    "latency_ms",
    "ttft_ms",
    "policy_version",
    "end_user",
    "tags",
)
EVENT_SELECT = (
    f"SELECT {', '.join(field.name for field in dataclasses.fields(LedgerEvent))} FROM usage_events"
)
# The rollup table a report reads, by the attribution column it needs ("" for none).
ROLLUP_TABLES = {"": "usage_rollup", "tag": "usage_rollup_tag", "end_user": "usage_rollup_user"}


def row_values(event: LedgerEvent, *, day: Any, streamed: Any, tags: Any) -> tuple[Any, ...]:
    """An event as a row in ``EVENT_COLUMNS`` order. The three columns each backend stores in
    its own type (the day, the streamed flag, the tags) come in already converted."""
    return (
        day,
        event.event_id,
        event.time_ms,
        event.key_id,
        event.team,
        event.model,
        event.provider,
        event.task,
        event.route,
        event.prompt_tokens,
        event.completion_tokens,
        event.cached_tokens,
        event.cache_write_tokens,
        event.cost_nanos,
        event.status,
        streamed,
        event.usage_source,
        event.attempts,
        event.latency_ms,
        event.ttft_ms,
        event.policy_version,
        event.end_user,
        tags,
    )
