"""Issue 26, item 6: after Redis is killed with SIGKILL and restarted from its AOF, the key's
and the team's budgets agree with the usage store and no reservation stays held.

Requests are mid-stream at the upstream (reserved, not yet settled) when Redis dies; their
settles fail with it. Their usage events were always spooled and replayed; the settles used to
be dropped, so ``spent`` stayed short and the holds stayed for their 1 h lease. Now they go to
the settle spool and are replayed (idempotent by request id) once Redis is back.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import openai
from counting_provider import CountingProvider
from redis_helpers import ClientFactory
from usage_workload import metered_gateway

from gateway.metering.limits import KeyLimits, Limiter
from gateway.money import usd_to_nanos
from gateway.store.embedded import EmbeddedRedis

IN_FLIGHT = 8
MAX_TOKENS = 20  # m-drip streams a token every 0.4 s: 8 s a request, ample to kill Redis


async def test_settles_failed_by_a_redis_kill_are_replayed_once_it_is_back(
    own_redis: EmbeddedRedis,
    provider: CountingProvider,
    counting_policy: Path,
    tmp_path: Path,
    make_client: ClientFactory,
) -> None:
    gateway = metered_gateway(own_redis.url, tmp_path / "gw", counting_policy).start()
    try:
        with gateway.admin() as admin:
            made = admin.post("/admin/teams", json={"id": "ops", "budgets_usd": {"day": 5}})
            assert made.status_code == 201, made.text
        key_id, key = gateway.create_key(
            name="outage", team="ops", budget_usd=1, budget_period="day"
        )
        limiter = Limiter(make_client(own_redis.url))
        key_limits = KeyLimits(budget_nanos=usd_to_nanos(1), budget_period="day")
        home = "team:ops"
        held_keys = [limiter.keys(key_id, home)[2], limiter.team_keys("ops")[2]]
        redis = make_client(own_redis.url)
        client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)

        async def stream(index: int) -> int:
            chunks = await client.chat.completions.create(
                model="m-drip",
                messages=[{"role": "user", "content": "one two three four five"}],
                max_tokens=MAX_TOKENS,
                stream=True,
                stream_options={"include_usage": True},
                user=f"kill-{index}",
            )
            return sum([1 async for c in chunks if c.choices and c.choices[0].delta.content])

        streams = [asyncio.create_task(stream(i)) for i in range(IN_FLIGHT)]

        deadline = time.monotonic() + 30
        while [await redis.hlen(k) for k in held_keys] != [IN_FLIGHT, IN_FLIGHT]:
            assert time.monotonic() < deadline, "the requests were not all reserved"
            await asyncio.sleep(0.02)
        await redis.aclose()
        await asyncio.to_thread(own_redis.kill)  # SIGKILL: the settles to come find no Redis
        assert await asyncio.gather(*streams) == [MAX_TOKENS] * IN_FLIGHT  # all answered
        await client.close()
        await asyncio.to_thread(own_redis.start)  # from the AOF: holds back, settles not in it

        store_cost = await _store_cost(gateway, key)
        assert store_cost > 0

        async def books() -> dict[str, Any]:
            key_view = await limiter.status(key_id, key_limits, home)
            with gateway.admin() as admin:
                team = admin.get("/admin/teams/ops").json()["usage"]["budgets"]["day"]
            replica = make_client(own_redis.url)
            held = [await replica.hlen(k) for k in held_keys]
            return {
                "key_spent": key_view["budget"]["spent_nanos"],
                "key_reserved": key_view["budget"]["reserved_nanos"],
                "team_spent": team["spent_nanos"],
                "team_reserved": team["reserved_nanos"],
                "held": held,
            }

        expected = {
            "key_spent": store_cost,
            "key_reserved": 0,
            "team_spent": store_cost,
            "team_reserved": 0,
            "held": [0, 0],
        }
        deadline = time.monotonic() + 60
        seen = await books()
        while seen != expected and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            seen = await books()
        assert seen == expected
        log = gateway.log_path.read_text()
        assert "settle_spooled" in log and "settle_spool_replayed" in log, log[-2000:]
    finally:
        gateway.stop()


async def _store_cost(gateway: Any, key: str) -> int:
    """The key's cost as the usage store has it, once every request's (spooled) event is in."""
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient() as http:
        while True:
            usage = await http.get(
                gateway.url + "/v1/usage", headers={"Authorization": f"Bearer {key}"}
            )
            if usage.status_code == 200 and usage.json()["requests"] == IN_FLIGHT:
                return int(usage.json()["total_cost_nanos"])
            assert time.monotonic() < deadline, f"usage did not arrive: {usage.text}"
            await asyncio.sleep(0.1)
