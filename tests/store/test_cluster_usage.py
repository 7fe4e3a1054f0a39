"""Issue 10: usage reconciles on a Redis Cluster. Requests through three gateways (one usage
store: the SQLite file of their shared DATA_DIR), with keys and buffer shards spread over all
three masters, add up in ``/admin/usage`` to exactly what the fake upstream served, token for
token, for every group-by, once the exporters have caught up."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fake_upstream import PROMPT_TOKENS, FakeUpstream
from gateway_runner import ADMIN_KEY, GatewayProcess
from openai import AsyncOpenAI
from redis_helpers import LoopbackCluster
from replica_load import new_key

from gateway.access.keys import parse_key, record_key

pytestmark = pytest.mark.slow

KEYS = 9
REQUESTS_PER_KEY = 8


def _report(base_url: str, group_by: str) -> dict:
    response = httpx.get(
        base_url + "/admin/usage",
        params={"group_by": group_by},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    return response.json()


async def _traffic(url: str, key: str, index: int) -> list[int]:
    """A few chat calls, streamed and not, on both models; returns the completion sizes."""
    sizes = []
    async with AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0) as client:
        for n in range(REQUESTS_PER_KEY):
            size = 1 + (index * 7 + n * 3) % 17
            model = "fake-model" if n % 3 else "other-model"
            messages = [{"role": "user", "content": f"hello {index} {n}"}]
            if n % 2:
                stream = await client.chat.completions.create(
                    model=model,
                    messages=messages,
                    max_tokens=size,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                usage = None
                async for chunk in stream:
                    usage = chunk.usage or usage
            else:
                usage = (
                    await client.chat.completions.create(
                        model=model, messages=messages, max_tokens=size
                    )
                ).usage
            assert usage is not None
            assert usage.completion_tokens == size
            sizes.append(size)
    return sizes


async def test_admin_usage_equals_what_upstream_served(
    gateways: list[GatewayProcess], cluster: LoopbackCluster, cluster_upstream: FakeUpstream
) -> None:
    urls = [g.url for g in gateways]
    keys = [new_key(gateways[i % 3], name=f"usage-{i}", team=f"team-{i % 2}") for i in range(KEYS)]
    key_ids = []
    for key in keys:
        parsed = parse_key(key)
        assert parsed is not None
        key_ids.append(parsed[0])
    assert len({cluster.owner_of(record_key(k)).port for k in key_ids}) >= 2
    gateways[0].wait_exported()
    before = {by: _report(urls[0], by)["totals"] for by in ("model", "team", "day")}
    seen_before = len(cluster_upstream.requests)

    sizes = await asyncio.gather(*(_traffic(urls[i % 3], k, i) for i, k in enumerate(keys)))

    served = list(cluster_upstream.requests)[seen_before:]
    assert len(served) == KEYS * REQUESTS_PER_KEY
    served_completion = sum(r.body["max_tokens"] for r in served)
    assert served_completion == sum(map(sum, sizes))
    served_prompt = PROMPT_TOKENS * len(served)

    gateways[1].wait_exported()
    by_key = _report(urls[1], "key")
    rows = {row["key"]: row for row in by_key["data"] if row["key"] in key_ids}
    assert set(rows) == set(key_ids)
    assert sum(row["requests"] for row in rows.values()) == len(served)
    assert sum(row["prompt_tokens"] for row in rows.values()) == served_prompt
    assert sum(row["completion_tokens"] for row in rows.values()) == served_completion
    for key_id, key_sizes in zip(key_ids, sizes, strict=True):
        assert rows[key_id]["completion_tokens"] == sum(key_sizes)
    # Every other grouping moved by exactly the same amounts.
    for group_by, totals_before in before.items():
        after = _report(urls[2], group_by)["totals"]
        assert after["requests"] - totals_before["requests"] == len(served)
        assert after["prompt_tokens"] - totals_before["prompt_tokens"] == served_prompt
        assert after["completion_tokens"] - totals_before["completion_tokens"] == served_completion
    # And the cost figures agree between groupings (integers, no float drift).
    assert (
        sum(r["cost_nanos"] for r in _report(urls[0], "model")["data"])
        == (_report(urls[0], "model")["totals"]["cost_nanos"])
    )
