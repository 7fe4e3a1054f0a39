"""Two gateway processes on one Redis and one usage store (PostgreSQL; or the default SQLite
file of a DATA_DIR they share), under mixed load (JSON, streams, fallbacks, clients leaving
mid-stream); one is killed with SIGKILL while its exporter holds a batch it has read but not
stored. The survivor claims that batch, every answered request is in the reports exactly once,
and the reports equal the provider's own books to the token and the nano-dollar."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
import redis
from counting_provider import CountingProvider
from usage_workload import (
    Call,
    Workload,
    delivered_books,
    metered_gateway,
    provider_totals,
    reconciled_ledger,
    run_workload,
)

from gateway.ledger import open_store
from gateway.metering.buffer import GROUP, buffer_key

CLAIM_IDLE_S = 1.0
# A client that leaves a stream by itself is done before the gateway is: the gateway records the
# request once it notices (at the next chunk it relays, or when the upstream stream ends: a drip
# stream's six chunks take 2.4 s). Bound by how long that may take on a loaded box: a request
# left this long before the kill was the gateway's to record, and must be in the reports.
LEAVE_GRACE_S = 10.0
GROUPS = ("model", "key")  # the reports checked against the ledger


@dataclass
class SharedStore:
    """Where the two gateways keep usage: their settings, and how the test blocks writers."""

    kind: str
    url: str
    data_dirs: tuple[Path, Path]
    sqlite_file: Path | None = None

    @contextlib.asynccontextmanager
    async def writers_blocked(self) -> AsyncIterator[None]:
        """Hold the store's write lock (readers go on): an exporter that reads a batch now
        waits inside its insert, with the batch pending in Redis."""
        if self.sqlite_file is not None:
            conn = sqlite3.connect(self.sqlite_file, isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield
            finally:
                conn.execute("ROLLBACK")
                conn.close()
            return
        conn = await asyncpg.connect(self.url)
        try:
            async with conn.transaction():
                await conn.execute("LOCK TABLE usage_rollup IN SHARE MODE")
                yield
        finally:
            await conn.close()


@pytest.fixture(params=["postgresql", "sqlite"])
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SharedStore]:
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_url")
        yield SharedStore("postgresql", url, (tmp_path / "gw-a", tmp_path / "gw-b"))
    else:  # one DATA_DIR, so both use its default store: DATA_DIR/usage/usage.sqlite3
        shared = tmp_path / "gw"
        yield SharedStore("sqlite", "", (shared, shared), shared / "usage" / "usage.sqlite3")


def _in_flight_at(call: Call, killed_at: float) -> bool:
    """Whether the killed gateway may still have been working on ``call`` when it died."""
    if call.error is not None:
        return True
    left = call.ended_at
    return call.kind == "disconnect" and left is not None and left > killed_at - LEAVE_GRACE_S


def pending_by_consumer(client: redis.Redis, store_id: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for shard in range(16):
        summary = client.xpending(buffer_key(store_id, shard), GROUP)
        for consumer in summary["consumers"]:
            name = consumer["name"].decode()
            counts[name] = counts.get(name, 0) + consumer["pending"]
    return counts


async def test_sigkill_mid_export_loses_nothing_and_counts_nothing_twice(
    clean_redis: str,
    provider: CountingProvider,
    counting_policy: Path,
    shared_store: SharedStore,
) -> None:
    settings = {"usage_export_claim_idle_s": str(CLAIM_IDLE_S), "usage_export_interval_s": "0.1"}
    if shared_store.url:
        settings["usage_store_url"] = shared_store.url
    dir_a, dir_b = shared_store.data_dirs
    doomed = metered_gateway(clean_redis, dir_a, counting_policy, **settings).start()
    survivor = metered_gateway(clean_redis, dir_b, counting_policy, **settings).start()
    client = redis.Redis.from_url(clean_redis)
    store = await open_store(shared_store.url, data_dir=dir_a)
    try:
        _, key = survivor.create_key(name="kill", team="ops")
        work = Workload.mixed(300, "k")
        held: dict[str, int] = {}
        killed_at: list[float] = []

        async def kill_mid_export() -> None:
            await asyncio.sleep(1.5)
            async with shared_store.writers_blocked():
                # Both exporters read their next batch and wait in the insert.
                doomed_prefix = f"-{doomed.process.pid}-"  # type: ignore[union-attr]
                for _ in range(60):
                    await asyncio.sleep(0.1)
                    pending = pending_by_consumer(client, store.store_id)
                    held.update({n: c for n, c in pending.items() if doomed_prefix in n and c})
                    if held:
                        break
                killed_at.append(time.monotonic())
                await asyncio.to_thread(doomed.kill)

        await asyncio.gather(
            run_workload([doomed.url, survivor.url], [key], work, pace_s=0.02), kill_mid_export()
        )
        assert held, "the killed gateway held no batch: the claim was not exercised"
        calls = work.calls
        on_doomed, on_survivor = calls[0::2], calls[1::2]
        answered_on_doomed = [c for c in on_doomed if c.answered]
        assert answered_on_doomed and [c for c in on_doomed if c.error], "kill was not mid-run"
        assert not [c for c in on_survivor if c.error]

        books = provider.snapshot()
        with survivor.admin() as admin:
            # Nothing left in the buffer: the killed exporter's batch was claimed and stored.
            survivor.wait_exported()
            # Every answered request has its exact event (all_events, under it, fails on an
            # event listed twice); events match the provider's books, and the reports them.
            answered = sum(c.answered for c in calls)
            events, ledger = reconciled_ledger(
                admin, books, calls, answered, timeout=1, answers_complete=False, group_bys=GROUPS
            )
        recorded_tags = {c.tag for c in calls if c.usage_id in events}
        # The provider's books of the requests that were recorded.
        delivered = delivered_books(books, calls, events)
        assert ledger == provider_totals({t: s for t, s in delivered.items() if t in recorded_tags})
        missing = [c for c in calls if c.tag in books and c.tag not in recorded_tags]
        # Only requests in flight on the killed gateway may be missing, and none was answered:
        # one the kill cut (the client saw it fail), or one its client had just left.
        assert all(
            c in on_doomed and not c.answered and _in_flight_at(c, killed_at[0]) for c in missing
        ), missing[:3]
        # The killed exporter's batch was claimed: nothing is left pending or buffered.
        assert pending_by_consumer(client, store.store_id) == {}
        assert "usage_export_claimed" in survivor.output()
        print(
            f"\n{shared_store.kind}: killed holding {sum(held.values())} buffered events; "
            f"{len(answered_on_doomed)} answered by it, all recorded; {len(missing)} in flight "
            f"there lost; {len(events)} events in all"
        )
    finally:
        await store.close()
        client.close()
        doomed.stop()
        survivor.stop()
