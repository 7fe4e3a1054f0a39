"""Issue 18 end to end, through ``switchyard serve`` processes on one Redis: a team's budget
stops its keys, never past it; a team's ``max_parallel_requests`` counts requests in flight on
every gateway, holds while their gateway lives (it renews their leases) and frees them when that
gateway is killed (the leases lapse); and a key moved to another team behind the gateways'
back keeps its spend exact across the move."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio
from fake_upstream import FakeUpstream, ThreadedFakeUpstream
from gateway_runner import PEPPER, POLICY, GatewayProcess, running_gateways
from ports import free_port
from replica_load import (
    CHAT,
    COST_NANOS_PER_REQUEST,
    HOLD_NANOS_PER_REQUEST,
    create_team,
    fire,
    key_to_move,
    outcomes,
)

from gateway.access.keys import KeyStore
from gateway.access.teams import team_home

pytestmark = pytest.mark.slow
LEASE_S = 1.5


def _team_usage(gateway: GatewayProcess, team_id: str) -> dict:
    with gateway.admin() as admin:
        return admin.get(f"/admin/teams/{team_id}").json()["usage"]


async def test_a_team_budget_stops_its_keys(replicas: list[GatewayProcess]) -> None:
    # $1.00 a day for the team: at most 50 requests of $0.02, whichever key sends them; each
    # is held at its bound ($0.129) until it settles, so a burst gets at least 7.
    create_team(replicas[0], "e2e-budget", budgets_usd={"day": 1.0, "week": 5.0})
    keys = [replicas[i].create_key(name=f"b{i}", team="e2e-budget")[1] for i in (1, 2)]
    responses = await fire([g.url for g in replicas], keys, 80)
    served = outcomes(responses).get("200", 0)
    assert outcomes(responses) == {"200": served, "429 insufficient_quota": 80 - served}
    assert 1_000_000_000 // HOLD_NANOS_PER_REQUEST <= served <= 50
    refused = next(r for r in responses if r.status_code == 429).json()["error"]["message"]
    assert "this key's team 'e2e-budget' may spend $1 per day" in refused
    usage = _team_usage(replicas[2], "e2e-budget")
    for period in ("day", "week"):
        assert usage["budgets"][period]["spent_nanos"] == served * COST_NANOS_PER_REQUEST
        assert usage["budgets"][period]["reserved_nanos"] == 0
    assert usage["budgets"]["day"]["remaining_nanos"] == 1_000_000_000 - served * 20_000_000


@pytest.fixture
def slow_upstream() -> Iterator[FakeUpstream]:
    with ThreadedFakeUpstream(slow_s=4.0) as upstream:
        yield upstream


async def test_max_parallel_requests_survive_renewal_and_lapse_with_a_dead_gateway(
    tmp_path: Path, slow_upstream: FakeUpstream, own_redis
) -> None:
    policy = tmp_path / "routing_rules.yaml"
    policy.write_text(POLICY.format(base_url=slow_upstream.base_url, dead_port=free_port()))
    with running_gateways(
        2,
        tmp_path / "data",
        policy,
        redis_url=own_redis.url,
        inflight_lease_s=LEASE_S,
        upstream_max_tries=1,
    ) as (doomed, survivor):
        create_team(survivor, "e2e-parallel", max_parallel_requests=2)
        _, key = survivor.create_key(name="parallel", team="e2e-parallel")
        headers = {"Authorization": f"Bearer {key}"}
        slow = {**CHAT, "model": "slow-model"}
        async with httpx.AsyncClient(timeout=30) as client:
            held = [
                asyncio.create_task(
                    client.post(doomed.url + "/v1/chat/completions", json=slow, headers=headers)
                )
                for _ in range(2)
            ]
            deadline = time.monotonic() + 10
            while _team_usage(survivor, "e2e-parallel")["parallel"]["in_flight"] < 2:
                assert time.monotonic() < deadline, "the slow requests never got in flight"
                await asyncio.sleep(0.05)
            # Past the lease, the living gateway has renewed its two requests: still full.
            await asyncio.sleep(LEASE_S + 0.5)
            full = await client.post(
                survivor.url + "/v1/chat/completions", json=CHAT, headers=headers
            )
            assert full.status_code == 429, full.text
            assert full.json()["error"]["code"] == "too_many_parallel_requests"
            assert "of team 'e2e-parallel'" in full.json()["error"]["message"]

            doomed.kill()  # SIGKILL: its two requests never settle, their leases stop renewing
            killed_at = time.monotonic()
            for task in held:
                with pytest.raises(httpx.HTTPError):
                    await task
            first_free = None
            while first_free is None:
                answer = await client.post(
                    survivor.url + "/v1/chat/completions", json=CHAT, headers=headers
                )
                if answer.status_code == 200:
                    first_free = time.monotonic() - killed_at
                else:
                    assert answer.json()["error"]["code"] == "too_many_parallel_requests"
                    assert time.monotonic() - killed_at < LEASE_S + 5, "the leases never lapsed"
                    await asyncio.sleep(0.1)
        print(f"\nin-flight slots of the killed gateway came back {first_free:.2f}s after kill -9")
        # Not at once (the killed gateway's last renewal still ran), and within the lease.
        assert 0.3 < first_free <= LEASE_S + 1.0
        assert _team_usage(survivor, "e2e-parallel")["parallel"]["in_flight"] == 0


async def test_gateways_follow_a_key_moved_behind_their_back(
    replicas: list[GatewayProcess], redis_url: str
) -> None:
    # $0.80: 40 requests of $0.02, and room for the holds ($0.129 each) of a burst of 5.
    key_id, key = key_to_move(replicas[0], "e2e-red", "e2e-blue", 0.8, "month")
    assert outcomes(await fire([g.url for g in replicas], key, 5)) == {"200": 5}
    # Moved by another hand (as a CLI elsewhere would): the record changes, no gateway sweeps;
    # each one finds out at its next reserve, follows the key and carries its counters over.
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        moved = await KeyStore(client, PEPPER.encode()).update(
            key_id, {"team": "e2e-blue"}, home=team_home("e2e-blue")
        )
        assert moved is not None and moved.home_epoch == 1
        rest = await fire([g.url for g in replicas], key, 60)
        served = outcomes(rest).get("200", 0)
        assert outcomes(rest) == {"200": served, "429 insufficient_quota": 60 - served}
        # Never past the budget, the 5 before the move included; at least the holds' share.
        assert served >= (800_000_000 - 5 * COST_NANOS_PER_REQUEST) // HOLD_NANOS_PER_REQUEST
        assert 5 + served <= 40
        blue = f"sy:{{team:e2e-blue}}:key:{key_id}:budget:month"
        # The spend before the move was carried over to the nano-dollar.
        assert int(await client.hget(blue, "spent")) == (5 + served) * COST_NANOS_PER_REQUEST
        assert int(await client.hget(blue, "reserved")) == 0
        assert not await client.exists(f"sy:{{team:e2e-red}}:key:{key_id}:budget:month")
    finally:
        await client.aclose()
    assert _team_usage(replicas[1], "e2e-red")["requests"]["used"] == 5
    assert _team_usage(replicas[1], "e2e-blue")["requests"]["used"] == served
