"""Fixtures of the batch tests: ``batch_store_url`` names a fresh store of each backend (a new
SQLite file, a new database on the session's scratch PostgreSQL); ``open_batch_store`` opens
batch stores on it (several calls: several replicas) after the usage store migrated it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from gateway.batches.store import BatchStore, make_batch_store
from gateway.ledger import open_store

BACKENDS = ("sqlite", "postgresql")

OpenBatchStore = Callable[[], Awaitable[BatchStore]]


@pytest.fixture(params=BACKENDS)
def batch_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'usage' / 'usage.sqlite3'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
async def open_batch_store(batch_store_url: str, tmp_path: Path) -> AsyncIterator[OpenBatchStore]:
    usage = await open_store(batch_store_url, data_dir=tmp_path)  # migrates the schema
    await usage.close()
    stores: list[BatchStore] = []

    async def opener() -> BatchStore:
        store = make_batch_store(batch_store_url, data_dir=tmp_path)
        await store.open()
        stores.append(store)
        return store

    yield opener
    for store in stores:
        await store.close()
