"""Which backend a usage-store URL names: ``make_store`` builds it (not yet opened),
``open_store`` builds and opens it, ``open_audit_store`` opens the audit table beside it. Kept apart from ``store.py`` so the backends, which use
that module's helpers, sit below this one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import asyncpg

from gateway.ledger.audit import AuditStore, PostgresAudit, SqliteAudit
from gateway.ledger.postgres_store import PostgresStore
from gateway.ledger.sqlite_store import SqliteStore
from gateway.ledger.store import (
    DEFAULT_RETENTION_DAYS,
    SQLITE_FILE,
    StoreConfigError,
    UsageStore,
    check_retention_days,
    check_store_url,
    redact,
)


def make_store(
    url: str,
    *,
    data_dir: Path,
    retention_days: int = DEFAULT_RETENTION_DAYS,
    clock: Callable[[], float] = time.time,
) -> UsageStore:
    """The store a URL names, not yet opened."""
    url = check_store_url(url)
    retention_days = check_retention_days(retention_days)
    if url.startswith(("postgresql:", "postgres:")):
        return PostgresStore(url, retention_days=retention_days, clock=clock)
    # As SQLAlchemy writes them: sqlite:///relative/path, sqlite:////absolute/path.
    path = Path(url.removeprefix("sqlite:///")) if url else data_dir / SQLITE_FILE
    return SqliteStore(path, retention_days=retention_days, clock=clock)


async def open_store(
    url: str,
    *,
    data_dir: Path,
    retention_days: int = DEFAULT_RETENTION_DAYS,
    clock: Callable[[], float] = time.time,
) -> UsageStore:
    """``make_store`` and ``open``: ready to insert and query."""
    store = make_store(url, data_dir=data_dir, retention_days=retention_days, clock=clock)
    await store.open()
    return store


async def open_audit_store(
    url: str, *, data_dir: Path, retention_days: int = DEFAULT_RETENTION_DAYS
) -> AuditStore:
    """The audit table of the store ``url`` names (``SWITCHYARD_USAGE_STORE_URL``), migrated."""
    url = check_store_url(url)
    usage = await open_store(url, data_dir=data_dir, retention_days=retention_days)
    await usage.close()  # opening it applied the migrations; the audit log keeps its own handle
    if url.startswith(("postgresql:", "postgres:")):
        try:
            pool = await asyncpg.create_pool(url, min_size=1, max_size=2, command_timeout=30)
        except (OSError, asyncpg.PostgresError, ValueError) as exc:
            raise StoreConfigError(
                f"cannot connect to the audit store {redact(url)}: {type(exc).__name__}"
            ) from None
        return PostgresAudit(pool, retention_days)
    path = Path(url.removeprefix("sqlite:///")) if url else data_dir / SQLITE_FILE
    return SqliteAudit(path, retention_days)
