"""Nothing answered goes unrecorded: Redis stopped for 5 s mid-run (usage spooled with fsync,
then replayed), and one of two gateway processes killed with SIGKILL mid-run."""

from __future__ import annotations

import asyncio
from pathlib import Path

from counting_provider import CountingProvider
from usage_workload import (
    Workload,
    admin_report_totals,
    metered_gateway,
    provider_totals,
    reconcile,
    run_workload,
    wait_for_events,
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
            events = wait_for_events(admin, 300, timeout=40)
            ledger = reconcile(books, calls, events)
            assert ledger == provider_totals(books)
            assert admin_report_totals(admin) == ledger
        log = gateway.log_path.read_text()
        assert "usage_spooled" in log and "usage_spool_replayed" in log, log[-2000:]
    finally:
        gateway.stop()


async def test_sigkill_of_one_gateway_loses_no_answered_request(
    clean_redis: str, provider: CountingProvider, counting_policy: Path, tmp_path: Path
) -> None:
    doomed = metered_gateway(clean_redis, tmp_path / "gw-a", counting_policy).start()
    survivor = metered_gateway(clean_redis, tmp_path / "gw-b", counting_policy).start()
    try:
        _, key = survivor.create_key(name="kill", team="ops")
        work = Workload.mixed(300, "k")

        async def kill_mid_run() -> None:
            await asyncio.sleep(2.5)
            await asyncio.to_thread(doomed.kill)

        await asyncio.gather(
            run_workload([doomed.url, survivor.url], [key], work, pace_s=0.02), kill_mid_run()
        )
        calls = work.calls
        on_doomed, on_survivor = calls[0::2], calls[1::2]
        answered_on_doomed = [c for c in on_doomed if c.answered]
        assert answered_on_doomed and [c for c in on_doomed if c.error], "kill was not mid-run"
        assert not [c for c in on_survivor if c.error]

        books = provider.snapshot()
        with survivor.admin() as admin:
            left = [c for c in on_survivor if c.kind == "disconnect"]  # recorded as they end
            events = wait_for_events(admin, len(left) + sum(c.answered for c in calls))
            # Every answered request has its exact event; events match the provider's books.
            reconcile(books, calls, events, answers_complete=False)
        recorded_tags = {c.tag for c in calls if c.usage_id in events}
        missing = [c for c in calls if c.tag in books and c.tag not in recorded_tags]
        # Only requests in flight on the killed gateway may be missing, and none was answered.
        assert all(c in on_doomed and not c.answered and c.error for c in missing), missing[:3]
        print(
            f"\nSIGKILL mid-run: {len(answered_on_doomed)} answered by the killed gateway, all "
            f"recorded; {len(missing)} in flight there lost; {len(events)} events in all"
        )
    finally:
        doomed.stop()
        survivor.stop()
