"""Issue 10: the limiter stays exact when its state lives on a 3-master Redis Cluster."""

from __future__ import annotations

import pytest
from gateway_runner import GatewayProcess
from redis_helpers import LoopbackCluster
from replica_load import (
    HOLD_TOKENS_PER_REQUEST,
    TOKENS_PER_REQUEST,
    fire,
    key_id_of,
    new_key,
    outcomes,
)

pytestmark = pytest.mark.slow


async def test_rpm_is_exact_across_three_gateways(
    gateways: list[GatewayProcess], cluster: LoopbackCluster
) -> None:
    key = new_key(gateways[0], name="cluster-rpm", rpm=100)
    responses = await fire([g.url for g in gateways], key, 300)
    assert outcomes(responses) == {"200": 100, "429 rate_limit_exceeded": 200}
    # The limiter's keys really are on the cluster, all in the key's one slot.
    owner = cluster.owner_of(f"sy:{{key:{key_id_of(key)}}}:rpm")
    with owner.client() as client:
        assert client.exists(f"sy:{{key:{key_id_of(key)}}}:rpm") == 1


async def test_tpm_never_passes_across_three_gateways(gateways: list[GatewayProcess]) -> None:
    tpm = 40 * TOKENS_PER_REQUEST
    key = new_key(gateways[0], name="cluster-tpm", tpm=tpm)
    responses = await fire([g.url for g in gateways], key, 120)
    served = outcomes(responses).get("200", 0)
    assert outcomes(responses) == {"200": served, "429 rate_limit_exceeded": 120 - served}
    # Each held at its bound until it settles: never more than fit, at least the holds' share.
    assert tpm // HOLD_TOKENS_PER_REQUEST <= served <= 40
