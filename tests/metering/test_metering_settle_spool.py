"""The settle spool (issue 26, item 6): settles and releases that Redis did not take are kept
on disk and replayed, and a replay never counts twice, whether or not the first try landed."""

from __future__ import annotations

from pathlib import Path

from redis_helpers import ClientFactory, settle_parts

from gateway.metering.limits import KeyLimits
from gateway.metering.settle_spool import SettleLineError, SpooledSettle
from gateway.metering.settler import Settlement
from gateway.store.embedded import EmbeddedRedis

LIMITS = KeyLimits(tpm=10_000, budget_nanos=1_000_000, budget_period="day")


async def test_a_replayed_settle_counts_once_whether_or_not_the_first_try_landed(
    clean_redis: str, make_client: ClientFactory, tmp_path: Path
) -> None:
    limiter, _, settler = settle_parts(make_client(clean_redis), tmp_path / "spool", "s1")
    landed = await limiter.reserve("k", LIMITS, tokens=500, cost_nanos=50_000, request_id="r1")
    lost = await limiter.reserve("k", LIMITS, tokens=500, cost_nanos=50_000, request_id="r2")
    gone = await limiter.reserve("k", LIMITS, tokens=500, cost_nanos=50_000, request_id="r3")
    # r1's settle ran but its reply was lost; r2's never ran; r3 was never served.
    assert await limiter.settle(landed, tokens=100, cost_nanos=7_000)
    await settler.retry(
        [
            SpooledSettle("settle", landed, 100, 7_000),
            SpooledSettle("settle", lost, 120, 9_000),
            SpooledSettle("release", gone),
        ]
    )
    assert settler.spool_depth() == 3
    assert await settler.replay_spool() == 3
    assert settler.spool_depth() == 0
    status = await limiter.status("k", LIMITS)
    assert status["budget"]["spent_nanos"] == 7_000 + 9_000  # r1 once, r2 once, r3 nothing
    assert status["budget"]["reserved_nanos"] == 0
    assert status["tokens"]["used"] == 100 + 120
    assert status["in_flight"] == 0  # no hold left
    assert await settler.replay_spool() == 0  # the spool is empty: nothing replays twice


async def test_a_settle_batch_that_cannot_reach_redis_spools_its_settles(
    own_redis: EmbeddedRedis, make_client: ClientFactory, tmp_path: Path
) -> None:
    limiter, _, settler = settle_parts(make_client(own_redis.url), tmp_path / "spool", "s1")
    held = await limiter.reserve("k", LIMITS, tokens=500, cost_nanos=50_000, request_id="r1")
    own_redis.kill()
    await settler.submit(Settlement(held, tokens=100, cost_nanos=7_000, event=None))
    assert settler.spool_depth() == 1
    own_redis.start()  # from the AOF: the hold is back, the settle is not in it
    assert (await limiter.status("k", LIMITS))["budget"]["reserved_nanos"] == 50_000
    assert await settler.replay_spool() == 1
    status = await limiter.status("k", LIMITS)
    assert (status["budget"]["spent_nanos"], status["budget"]["reserved_nanos"]) == (7_000, 0)


def test_a_torn_line_is_refused() -> None:
    for line in (b'{"mode": "settle"', b'{"mode": "refund"}', b"{}", b'{"mode": "release"}'):
        try:
            SpooledSettle.from_json(line)
        except SettleLineError:
            continue
        raise AssertionError(f"accepted {line!r}")
