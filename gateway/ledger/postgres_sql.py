"""PostgreSQL schema and statements of the usage store, independent of the driver.

Raw events go to ``usage_events``, range-partitioned by UTC day (one table per day, named
``usage_events_pYYYYMMDD``), so retention drops whole partitions. PostgreSQL requires the
partition key in every unique constraint, so the event's identity is ``(day, event_id)``: the
day is derived from the event's own time, which a re-delivery carries unchanged, hence a
duplicate always lands on the same day and is refused there.

One statement inserts a batch and updates the three rollups: a data-modifying CTE inserts the
events with ``ON CONFLICT DO NOTHING RETURNING``, and the rollup upserts read only what it
returned, so a duplicate never counts twice. Its source is the connection's temp staging table
filled by COPY (``INSERT_FROM_STAGE``, read in (day, event_id) order), or, for the benchmark's
comparison, arrays (``INSERT_UNNEST``) or a ``VALUES`` list. Rollup rows are upserted in sorted
order too, so concurrent writers take row locks in one order.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, timedelta
from typing import Any

from gateway.ledger.audit import POSTGRES_MIGRATION as AUDIT_MIGRATION
from gateway.ledger.batch_tables import POSTGRES_MIGRATION as BATCH_MIGRATION
from gateway.ledger.batch_tables import POSTGRES_NATIVE_MIGRATION as NATIVE_BATCH_MIGRATION
from gateway.ledger.dead_letters import POSTGRES_MIGRATION as DEAD_LETTER_MIGRATION
from gateway.ledger.event import UsageEvent
from gateway.ledger.tables import (
    COUNTERS,
    EVENT_COLUMNS,
    event_columns_ddl,
    row_values,
    usage_schema_sql,
)

EVENT_TYPES = (
    "date",
    "text",
    "bigint",
    "text",
    "text",
    "text",
    "text",
    "text",
    "text",
    "bigint",
    "bigint",
    "bigint",
    "bigint",
    "bigint",
    "smallint",
    "boolean",
    "text",
    "integer",
    "integer",
    "integer",
    "text",
    "text",
    "text[]",
    "text",  # price_catalogue (migration 5)
)
STAGE_TABLE = "usage_events_stage"
PARTITION_PREFIX = "usage_events_p"
# Partitions are created this many days ahead of today, so midnight never waits on DDL.
PARTITIONS_AHEAD = 3
# Advisory lock ids (any fixed 64-bit numbers): schema migration and partition DDL.
SCHEMA_LOCK = 0x5359_4C45_0001
PARTITION_LOCK = 0x5359_4C45_0002

_EVENT_DDL = event_columns_ddl(EVENT_TYPES)

# Each entry upgrades the schema by one version; never edit one that has shipped.
MIGRATIONS: tuple[str, ...] = (
    usage_schema_sql(EVENT_TYPES, events_options=" PARTITION BY RANGE (day)", options=""),
    AUDIT_MIGRATION,  # version 2: the admin audit log (gateway/ledger/audit.py)
    # 3: the store's identity, made once with the store (see UsageStore.store_id).
    """
CREATE TABLE usage_store_identity (
  singleton smallint PRIMARY KEY CHECK (singleton = 1),
  store_id text NOT NULL
);
INSERT INTO usage_store_identity (singleton, store_id)
  VALUES (1, substr(replace(gen_random_uuid()::text, '-', ''), 1, 16));
""",
    DEAD_LETTER_MIGRATION,  # 4: events the store could not keep (gateway/ledger/dead_letters.py)
    # 5: the price catalogue an event was costed from ("" for the policy's own price).
    "ALTER TABLE usage_events ADD COLUMN price_catalogue text NOT NULL DEFAULT ''",
    BATCH_MIGRATION,  # 6: batch files, batches and their lines (gateway/ledger/batch_tables.py)
    NATIVE_BATCH_MIGRATION,  # 7: lines sent to a provider's own batch API (batch_tables.py)
)
SCHEMA_VERSION = len(MIGRATIONS)
SELECT_STORE_ID = "SELECT store_id FROM usage_store_identity"

CREATE_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS usage_schema_version (
  version integer PRIMARY KEY,
  applied_at timestamptz NOT NULL DEFAULT now()
)
"""

CREATE_STAGE = f"""
CREATE TEMP TABLE IF NOT EXISTS {STAGE_TABLE} (
  {_EVENT_DDL.replace(" NOT NULL", "")}
) ON COMMIT DELETE ROWS
"""

LIST_PARTITIONS = f"""
SELECT child.relname FROM pg_inherits
JOIN pg_class parent ON parent.oid = pg_inherits.inhparent
JOIN pg_class child ON child.oid = pg_inherits.inhrelid
JOIN pg_namespace ns ON ns.oid = parent.relnamespace
WHERE parent.relname = 'usage_events' AND ns.nspname = current_schema()
  AND child.relname LIKE '{PARTITION_PREFIX}%'
"""


def partition_name(day: date) -> str:
    return f"{PARTITION_PREFIX}{day:%Y%m%d}"


def partition_day(name: str) -> date | None:
    digits = name.removeprefix(PARTITION_PREFIX)
    if len(digits) != 8 or not digits.isdigit():
        return None
    return date(int(digits[:4]), int(digits[4:6]), int(digits[6:]))


def create_partition_sql(day: date) -> str:
    # Dates render as ISO text: nothing here comes from a client.
    return (
        f"CREATE TABLE IF NOT EXISTS {partition_name(day)} PARTITION OF usage_events "
        f"FOR VALUES FROM ('{day.isoformat()}') TO ('{(day + timedelta(days=1)).isoformat()}')"
    )


def drop_partition_sql(day: date) -> str:
    return f"DROP TABLE IF EXISTS {partition_name(day)}"


_EVENT_LIST = ", ".join(EVENT_COLUMNS)
_RETURNED = (
    "day, key_id, team, model, provider, task, prompt_tokens, completion_tokens, cached_tokens,"
    " cache_write_tokens, cost_nanos, status, latency_ms, streamed, usage_source, end_user, tags"
)
_SUMS = (
    "count(*), sum(prompt_tokens), sum(completion_tokens), sum(cached_tokens),"
    " sum(cache_write_tokens), sum(cost_nanos), count(*) FILTER (WHERE status >= 400),"
    " sum(latency_ms), count(*) FILTER (WHERE streamed),"
    " count(*) FILTER (WHERE usage_source = 'estimated')"
)
_ADD_COUNTERS = ", ".join(f"{name} = r.{name} + EXCLUDED.{name}" for name in COUNTERS)
_COUNTER_LIST = ", ".join(COUNTERS)


def _rollup_cte(name: str, table: str, extra: str, extra_expr: str, source: str) -> str:
    keys = f"day, {extra + ', ' if extra else ''}key_id, team, model, provider, task"
    selected = f"day, {extra_expr + ', ' if extra else ''}key_id, team, model, provider, task"
    return (
        f"{name} AS (INSERT INTO {table} AS r ({keys}, {_COUNTER_LIST})\n"
        f"  SELECT {selected}, {_SUMS} FROM {source}\n"
        f"  GROUP BY {keys} ORDER BY {keys}\n"
        f"  ON CONFLICT ({keys}) DO UPDATE SET {_ADD_COUNTERS})"
    )


def insert_sql(source: str) -> str:
    """One statement: insert rows selected by ``source`` (a SELECT yielding EVENT_COLUMNS in
    order), roll up the ones actually inserted, and return how many that was."""
    return (
        f"WITH ins AS (INSERT INTO usage_events ({_EVENT_LIST})\n"
        f"  {source}\n"
        f"  ON CONFLICT DO NOTHING RETURNING {_RETURNED}),\n"
        + _rollup_cte("r_main", "usage_rollup", "", "", "ins")
        + ",\n"
        + _rollup_cte(
            "r_tag",
            "usage_rollup_tag",
            "tag",
            "tag",
            # An untagged request counts under the empty tag, like an empty team.
            "ins CROSS JOIN LATERAL unnest(CASE WHEN cardinality(ins.tags) = 0"
            " THEN ARRAY[''] ELSE ins.tags END) AS t(tag)",
        )
        + ",\n"
        + _rollup_cte("r_user", "usage_rollup_user", "end_user", "end_user", "ins")
        + "\nSELECT count(*) FROM ins"
    )


# The batch as one array per column; tags travel comma-joined (a comma is not a tag character).
UNNEST_SOURCE = (
    "SELECT day, event_id, time_ms, key_id, team, model, provider, task, route, prompt_tokens,"
    " completion_tokens, cached_tokens, cache_write_tokens, cost_nanos, status, streamed,"
    " usage_source, attempts, latency_ms, ttft_ms, policy_version, end_user,"
    " string_to_array(tags, ','), price_catalogue FROM unnest("
    + ", ".join(
        f"${index}::{'text' if kind == 'text[]' else kind}[]"
        for index, kind in enumerate(EVENT_TYPES, start=1)
    )
    + f") AS s({_EVENT_LIST})"
)
INSERT_UNNEST = insert_sql(UNNEST_SOURCE)
INSERT_FROM_STAGE = insert_sql(f"SELECT {_EVENT_LIST} FROM {STAGE_TABLE} ORDER BY day, event_id")


def values_source(rows: int) -> str:
    """A multi-row VALUES list of ``rows`` rows with typed placeholders (benchmark method)."""
    width = len(EVENT_COLUMNS)
    tuples = []
    for row in range(rows):
        base = row * width
        tuples.append(
            "("
            + ", ".join(f"${base + col + 1}::{kind}" for col, kind in enumerate(EVENT_TYPES))
            + ")"
        )
    return f"SELECT * FROM (VALUES {', '.join(tuples)}) AS v({_EVENT_LIST})"


def event_row(event: UsageEvent) -> tuple[Any, ...]:
    """An event as a row in EVENT_COLUMNS order."""
    return row_values(event, day=event.day, streamed=event.streamed, tags=list(event.tags))


def unnest_columns(rows: Sequence[tuple[Any, ...]]) -> list[list[Any]]:
    """The UNNEST_SOURCE parameters: one list per column, tags comma-joined."""
    columns = [list(column) for column in zip(*rows, strict=True)]
    columns[-1] = [",".join(tags) for tags in columns[-1]]
    return columns
