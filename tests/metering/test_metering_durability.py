"""Nothing answered goes unrecorded: Redis stopped for 5 s mid-run (usage spooled with fsync,
then replayed into the buffer and exported). One of two gateway processes killed with SIGKILL
mid-run is test_metering_replicas.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

from counting_provider import CountingProvider
from usage_workload import (
    Workload,
    delivered_books,
    metered_gateway,
    provider_totals,
    reconciled_ledger,
    run_workload,
)

from gateway.store.embedded import EmbeddedRedis


async def test_redis_down_for_5s_spools_then_replays_every_record(
    own_redis: EmbeddedRedis, provider: CountingProvider, counting_policy: Path, tmp_path: Path
) -> None:
    gateway = metered_gateway(
        own_redis.url,
        tmp_path / "gw",
        counting_policy,
        limits_on_redis_failure="open",
        fail_open_window_s="60",
    ).start()
    try:
        _, key = gateway.create_key(name="outage", team="ops")
        work = Workload.mixed(300, "o")

        async def outage() -> None:
            await asyncio.sleep(1.5)
            await asyncio.to_thread(own_redis.kill)
            await asyncio.sleep(5)
            await asyncio.to_thread(own_redis.start)

        # One request every 25 ms: the run spans the whole outage on both sides.
        await asyncio.gather(run_workload([gateway.url], [key], work, pace_s=0.025), outage())

        calls = work.calls
        assert not [c for c in calls if c.error], [c.error for c in calls if c.error][:5]
        books = provider.snapshot()
        assert len(books) == 300
        with gateway.admin() as admin:
            events, ledger = reconciled_ledger(admin, books, calls, 300, timeout=40)
            assert ledger == provider_totals(delivered_books(books, calls, events))
        log = gateway.log_path.read_text()
        assert "usage_spooled" in log and "usage_spool_replayed" in log, log[-2000:]
    finally:
        gateway.stop()
