"""The SQL usage store: every usage event kept in SQLite (embedded) or PostgreSQL (shared).

``open_store(url, data_dir=...)`` returns a ``UsageStore``: ``insert`` batches of
``UsageEvent`` idempotently, read exact integer totals with ``rollup(RollupQuery(...))``
(rollup tables only, never raw events), page raw events with ``list_events(EventQuery(...))``
and run ``maintain()`` periodically for partitions and retention. Nothing here knows Redis:
the exporter that feeds it from the Redis buffer lives with the gateway's metering.
"""

from gateway.ledger.backends import make_store, open_store
from gateway.ledger.event import MAX_TAGS, UsageError, UsageEvent
from gateway.ledger.query import (
    GROUP_BYS,
    EventCursor,
    EventPage,
    EventQuery,
    LedgerQueryError,
    RollupQuery,
    RollupRow,
    Totals,
    UsageFilter,
)
from gateway.ledger.store import (
    DEFAULT_RETENTION_DAYS,
    RetentionResult,
    StoreConfigError,
    UsageStore,
    check_store_url,
)

__all__ = [
    "DEFAULT_RETENTION_DAYS",
    "GROUP_BYS",
    "MAX_TAGS",
    "EventCursor",
    "EventPage",
    "EventQuery",
    "LedgerQueryError",
    "RetentionResult",
    "RollupQuery",
    "RollupRow",
    "StoreConfigError",
    "Totals",
    "UsageError",
    "UsageEvent",
    "UsageFilter",
    "UsageStore",
    "check_store_url",
    "make_store",
    "open_store",
]
