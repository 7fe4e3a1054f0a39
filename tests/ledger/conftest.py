"""Fixtures for the usage-store contract: every test runs once on SQLite, once on PostgreSQL.

``store_url`` names a fresh store of the parametrized backend (a new SQLite file, or a new
database on the session's scratch PostgreSQL); ``open_ledger`` opens stores on it (several
calls give several independent writers, as replicas would be) and closes them after the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

# pytest's default import mode puts this folder on sys.path: the helpers import by name.
from sqlstore_support import DAY0, Clock, noon

from gateway.ledger import UsageStore, open_store

BACKENDS = ("sqlite", "postgresql")

OpenLedger = Callable[..., Awaitable[UsageStore]]


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'usage' / 'usage.sqlite3'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def clock() -> Clock:
    """Noon of the last of the five days make_events spreads events over."""
    return Clock(noon(DAY0) + 4 * 86_400)


@pytest.fixture
async def open_ledger(store_url: str, tmp_path: Path, clock: Clock) -> AsyncIterator[OpenLedger]:
    stores: list[UsageStore] = []

    async def opener(**options: object) -> UsageStore:
        options.setdefault("clock", clock)
        store = await open_store(store_url, data_dir=tmp_path, **options)  # type: ignore[arg-type]
        stores.append(store)
        return store

    yield opener
    for store in stores:
        await store.close()


@pytest.fixture
async def store(open_ledger: OpenLedger) -> UsageStore:
    return await open_ledger()
