"""EVALSHA on a cluster: each master keeps its own script cache (a failover promotes a replica
with an empty one). A settle batch spanning every master after SCRIPT FLUSH must still settle
each request exactly once, and record each in the usage buffer."""

from __future__ import annotations

from pathlib import Path

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis_helpers import LoopbackCluster, settle_parts, settle_round

from gateway.access.keys import record_key
from gateway.ledger import UsageStore
from gateway.metering.limits import KeyLimits
from gateway.money import usd_to_nanos


async def _flush_one_master(cluster: LoopbackCluster) -> None:
    node = Redis(host="127.0.0.1", port=cluster.nodes[1].port)
    try:
        await node.script_flush()
    finally:
        await node.aclose()


async def test_settle_batch_after_script_flush_on_every_master(
    client: RedisCluster, cluster: LoopbackCluster, usage_store: UsageStore, tmp_path: Path
) -> None:
    limiter, recorder, settler = settle_parts(client, tmp_path / "spool", usage_store.store_id)
    key_ids = [f"noscript{i:02d}" for i in range(12)]
    assert len({cluster.owner_of(record_key(k)).port for k in key_ids}) == 3
    limits = KeyLimits(rpm=1000, tpm=100_000, budget_nanos=usd_to_nanos(10.0), budget_period="day")

    await client.script_flush()  # every master
    await settle_round(limiter, settler, key_ids, limits, "a")
    assert await client.script_exists(limiter._settle_lua.sha) == [True]
    await _flush_one_master(cluster)  # one master only, as after a failover
    await settle_round(limiter, settler, key_ids, limits, "b")

    assert recorder.spool_depth() == 0  # nothing failed over to the spool
    for index, key_id in enumerate(key_ids):
        status = await limiter.status(key_id, limits)
        assert status["in_flight"] == 0
        assert status["tokens"]["used"] == 2 * (10 + index)
        assert status["budget"]["reserved_nanos"] == 0
        assert status["budget"]["spent_nanos"] == usd_to_nanos(0.002)
    assert (await recorder.buffer.stats()).backlog == 2 * len(key_ids)
