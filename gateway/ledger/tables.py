"""The table layout both SQL backends share: event columns, rollup tables and their counters,
the event SELECT, and the first schema's DDL, rendered in each backend's types.

Each backend writes its own statements and the rest of its DDL (column types, partitions and
placeholders differ); what is named here is what they must agree on, so that one set of tests
proves both.
``EVENT_COLUMNS`` is the column order of ``usage_events`` and of every row a backend writes;
``EVENT_SELECT`` reads the columns back in ``UsageEvent`` field order, so a row (once its
values are Python types again) is ``UsageEvent(*row)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from gateway.ledger.event import UsageEvent

# The columns of schema version 1, which its migration renders (never changes).
EVENT_COLUMNS_V1 = (
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
# Added by later migrations, in order: 5, the price catalogue an event was costed from.
EVENT_COLUMNS = (*EVENT_COLUMNS_V1, "price_catalogue")
EVENT_SELECT = (
    f"SELECT {', '.join(field.name for field in dataclasses.fields(UsageEvent))} FROM usage_events"
)
# The rollup table a report reads, by the attribution column it needs ("" for none).
ROLLUP_TABLES = {"": "usage_rollup", "tag": "usage_rollup_tag", "end_user": "usage_rollup_user"}
# Summed counters, in the order of the rollup tables' columns.
COUNTERS = (
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "cost_nanos",
    "errors",
    "latency_ms",
    "streamed",
    "estimated",
)


def event_columns_ddl(types: Sequence[str], columns: Sequence[str] = EVENT_COLUMNS) -> str:
    """The column list of ``usage_events`` with ``types`` in ``columns`` order (only
    ``ttft_ms`` may be NULL)."""
    return ",\n  ".join(
        f"{name} {kind}{'' if name == 'ttft_ms' else ' NOT NULL'}"
        for name, kind in zip(columns, types, strict=True)
    )


def usage_schema_sql(event_types: Sequence[str], *, events_options: str, options: str) -> str:
    """Schema version 1, the events and the three rollups, in one backend's column types (the
    rollups take the events' types for their columns: a day, text and a 64-bit counter like
    ``cost_nanos``) and table options. A shipped migration: the text it renders never changes
    (the columns later migrations add are left out)."""
    event_types = event_types[: len(EVENT_COLUMNS_V1)]  # version 1's columns only
    types = dict(zip(EVENT_COLUMNS_V1, event_types, strict=True))
    day, text = types["day"], types["key_id"]
    dimensions = (
        f"key_id {text} NOT NULL, team {text} NOT NULL, model {text} NOT NULL,\n"
        f"  provider {text} NOT NULL, task {text} NOT NULL"
    )
    counters = ",\n  ".join(f"{name} {types['cost_nanos']} NOT NULL" for name in COUNTERS)
    return f"""
CREATE TABLE usage_events (
  {event_columns_ddl(event_types, EVENT_COLUMNS_V1)},
  PRIMARY KEY (day, event_id)
){events_options};
CREATE INDEX usage_events_time ON usage_events (time_ms, event_id);
CREATE INDEX usage_events_key_time ON usage_events (key_id, time_ms, event_id);
CREATE TABLE usage_rollup (
  day {day} NOT NULL, {dimensions},
  {counters},
  PRIMARY KEY (day, key_id, team, model, provider, task)
){options};
CREATE INDEX usage_rollup_key_day ON usage_rollup (key_id, day);
CREATE TABLE usage_rollup_tag (
  day {day} NOT NULL, tag {text} NOT NULL, {dimensions},
  {counters},
  PRIMARY KEY (day, tag, key_id, team, model, provider, task)
){options};
CREATE TABLE usage_rollup_user (
  day {day} NOT NULL, end_user {text} NOT NULL, {dimensions},
  {counters},
  PRIMARY KEY (day, end_user, key_id, team, model, provider, task)
){options};
"""


def row_values(event: UsageEvent, *, day: Any, streamed: Any, tags: Any) -> tuple[Any, ...]:
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
        event.price_catalogue,
    )
