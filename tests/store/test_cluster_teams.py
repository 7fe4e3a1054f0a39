"""Issue 18: a team's limits on a 3-master Redis Cluster, through three gateway processes.

A key of a team keeps its limiter state in the team's hash slot, so the key and its team are
checked in one script on one node: two keys of one team share the team's rpm exactly, and a
key moved to another team (its state carried to the other team's slot) keeps its own budget."""

from __future__ import annotations

import asyncio

import pytest
from gateway_runner import GatewayProcess
from redis_helpers import LoopbackCluster
from replica_load import (
    COST_NANOS_PER_REQUEST,
    HOLD_NANOS_PER_REQUEST,
    chat,
    create_team,
    fire,
    key_id_of,
    key_to_move,
    outcomes,
)

pytestmark = pytest.mark.slow


async def test_two_keys_of_a_team_share_its_rpm_exactly(
    gateways: list[GatewayProcess], cluster: LoopbackCluster
) -> None:
    create_team(gateways[0], "cluster-search", rpm=100)
    keys = [gateways[i].create_key(name=f"search-{i}", team="cluster-search")[1] for i in (1, 2)]
    # One request of each key through each gateway first: the burst then races on the limiter
    # alone, not on which gateway has looked a key up yet.
    warm = [chat(g.url, key) for g in gateways for key in keys]
    assert [r.status_code for r in warm] == [200] * 6
    responses = await fire([g.url for g in gateways], keys, 300)
    assert outcomes(responses) == {"200": 94, "429 rate_limit_exceeded": 206}
    for key_index in (0, 1):
        refused = [
            r for i, r in enumerate(responses) if r.status_code == 429 and i % 2 == key_index
        ]
        assert refused, "each key's burst meets the team's limit"
        assert all("of team 'cluster-search'" in r.json()["error"]["message"] for r in refused)
        assert {r.headers["x-ratelimit-limit-requests"] for r in refused} == {"100"}
    # The team's counters and both keys' own sit on one node, in one slot.
    team_rpm = "sy:{team:cluster-search}:rpm"
    key_rpms = [f"sy:{{team:cluster-search}}:key:{key_id_of(key)}:rpm" for key in keys]
    owner = cluster.owner_of(team_rpm)
    assert {cluster.owner_of(name).port for name in key_rpms} == {owner.port}
    with owner.client() as node:
        assert node.cluster("keyslot", team_rpm) == node.cluster("keyslot", key_rpms[0])
        assert all(node.exists(name) for name in (team_rpm, *key_rpms))
    with gateways[2].admin() as admin:
        usage = admin.get("/admin/teams/cluster-search").json()["usage"]
    assert (usage["requests"]["used"], usage["requests"]["remaining"]) == (100, 0)


async def test_a_key_moved_between_teams_keeps_its_budget_on_the_cluster(
    gateways: list[GatewayProcess], cluster: LoopbackCluster
) -> None:
    # $2.00: 100 requests of $0.02, and room for the holds ($0.129 each) of a burst of 12.
    key_id, key = key_to_move(gateways[0], "cluster-red", "cluster-blue", 2.0, "day")
    # The two teams' slots are on different masters: the move crosses nodes.
    assert (
        cluster.owner_of("sy:{team:cluster-red}").port
        != cluster.owner_of("sy:{team:cluster-blue}").port
    ), "pick team names on different masters"
    first = await fire([g.url for g in gateways], key, 12)
    assert outcomes(first) == {"200": 12}
    with gateways[1].admin() as admin:
        moved = admin.patch(f"/admin/keys/{key_id}", json={"team": "cluster-blue"})
        assert moved.status_code == 200 and moved.json()["team"] == "cluster-blue"
    # Every gateway, its cached record stale or not, goes on from the key's 12 requests.
    rest = await fire([g.url for g in gateways], key, 100)
    served = outcomes(rest).get("200", 0)
    assert outcomes(rest) == {"200": served, "429 insufficient_quota": 100 - served}
    assert served >= (2_000_000_000 - 12 * COST_NANOS_PER_REQUEST) // HOLD_NANOS_PER_REQUEST
    assert 12 + served <= 100
    await asyncio.sleep(1.5)  # the background sweep has run on every gateway since
    with gateways[2].admin() as admin:
        red = admin.get("/admin/teams/cluster-red").json()["usage"]
        blue = admin.get("/admin/teams/cluster-blue").json()["usage"]
    assert red["requests"]["used"] == 12 and blue["requests"]["used"] == served
    blue_state = f"sy:{{team:cluster-blue}}:key:{key_id}:budget:day"
    with cluster.owner_of(blue_state).client() as node:
        spent = int(node.hget(blue_state, "spent"))
        reserved = int(node.hget(blue_state, "reserved"))
    assert (spent, reserved) == ((12 + served) * COST_NANOS_PER_REQUEST, 0)
    red_state = f"sy:{{team:cluster-red}}:key:{key_id}:budget:day"
    with cluster.owner_of(red_state).client() as node:
        assert node.exists(red_state) == 0  # the red slot holds nothing of the key now
