"""Two gateway processes on one Redis and one PostgreSQL share a batch; one is killed with
SIGKILL while it holds lines. Its leases lapse, the other claims those lines again, and the
batch completes with every line answered exactly once in the output."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import openai
import pytest
from batch_support import chat_jsonl, jsonl, wait_until
from gateway_runner import GatewayProcess
from loopback import ServedOnThread
from slow_upstream import SlowUpstream, slow_policy

pytestmark = pytest.mark.slow

LINES = 120
LEASE_S = 1.5


@pytest.fixture
def upstream() -> Iterator[SlowUpstream]:
    with ServedOnThread(SlowUpstream(delay_s=0.1)) as server:
        yield server


def replica(data_dir: Path, policy: Path, redis_url: str, store_url: str) -> GatewayProcess:
    return GatewayProcess(
        data_dir,
        policy,
        redis_url=redis_url,
        usage_store_url=store_url,
        upstream_max_tries=1,
        access_log="false",
        batch_lease_s=LEASE_S,
        batch_poll_interval_s=0.05,
        batch_concurrency=4,
    )


async def lease_holders(store_url: str) -> dict[str, int]:
    conn = await asyncpg.connect(store_url)
    try:
        rows = await conn.fetch(
            "SELECT owner, count(*) FROM batch_lines WHERE state = 'leased' GROUP BY owner"
        )
    finally:
        await conn.close()
    return {row[0]: row[1] for row in rows}


def test_a_replica_killed_mid_batch_leaves_no_line_twice_and_none_missing(
    clean_redis: str, postgres_url: str, upstream: SlowUpstream, tmp_path: Path
) -> None:
    policy = tmp_path / "routing_rules.yaml"
    policy.write_text(slow_policy(upstream.url))
    doomed = replica(tmp_path / "a", policy, clean_redis, postgres_url)
    survivor = replica(tmp_path / "b", policy, clean_redis, postgres_url)
    for gateway in (doomed, survivor):
        gateway.launch()
    try:
        for gateway in (doomed, survivor):
            gateway.wait_ready()
        _, key = survivor.create_key(name="replicas")
        client = openai.OpenAI(api_key=key, base_url=doomed.url + "/v1", max_retries=0)
        uploaded = client.files.create(
            file=("in.jsonl", chat_jsonl(LINES, model=lambda _: "slow-model")), purpose="batch"
        )
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )

        # Both replicas work the batch before one dies holding lines.
        def both_hold_lines() -> dict[str, int] | None:
            found = asyncio.run(lease_holders(postgres_url))
            return found if len(found) == 2 else None

        holders = wait_until(both_hold_lines, 30, "both replicas to hold lines")
        doomed.kill()
        assert len(holders) == 2

        after = openai.OpenAI(api_key=key, base_url=survivor.url + "/v1", max_retries=0)

        def ended() -> object:
            current = after.batches.retrieve(batch.id)
            return current if current.status in ("completed", "failed", "expired") else None

        done = wait_until(ended, 90, "the survivor to finish the batch")
        assert done.status == "completed"
        assert (done.request_counts.total, done.request_counts.completed) == (LINES, LINES)
        output = jsonl(after.files.content(done.output_file_id).text)
        ids = [line["custom_id"] for line in output]
        assert len(ids) == len(set(ids)) == LINES  # none twice, none missing
        assert done.error_file_id is None
        # Every line reached the upstream; only lines the killed replica held came twice.
        arrivals = upstream.arrivals
        assert len(set(arrivals)) == LINES
        assert len(arrivals) - LINES <= 4
    finally:
        for gateway in (survivor, doomed):
            gateway.stop()
