"""Rotation and revocation through the admin API of one gateway, seen by the others, on a
Redis Cluster (the key record and its rotation record share one slot)."""

from __future__ import annotations

import time

import httpx
import pytest
from gateway_runner import ADMIN_KEY, GatewayProcess
from replica_load import chat, new_key

from gateway.access.keys import parse_key

pytestmark = pytest.mark.slow

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _status_everywhere(gateways: list[GatewayProcess], key: str) -> set[int]:
    return {chat(g.url, key).status_code for g in gateways}


def test_rotate_and_revoke_across_gateways(gateways: list[GatewayProcess]) -> None:
    old_key = new_key(gateways[0], name="rotating")
    parsed = parse_key(old_key)
    assert parsed is not None
    key_id = parsed[0]
    assert _status_everywhere(gateways, old_key) == {200}

    rotate = f"{gateways[1].url}/admin/keys/{key_id}/rotate"
    headers = {**ADMIN, "Idempotency-Key": "deploy-42"}
    first = httpx.post(rotate, json={"grace_seconds": 60}, headers=headers, timeout=10)
    assert first.status_code == 200, first.text
    replay = httpx.post(
        rotate.replace(gateways[1].url, gateways[2].url),
        json={"grace_seconds": 60},
        headers=headers,
        timeout=10,
    )
    assert replay.status_code == 200, replay.text
    rotated_key = first.json()["key"]
    assert replay.json()["key"] == rotated_key != old_key
    # Both secrets work during the grace period, on every gateway.
    assert _status_everywhere(gateways, rotated_key) == {200}
    assert _status_everywhere(gateways, old_key) == {200}

    revoked = httpx.post(f"{gateways[2].url}/admin/keys/{key_id}/revoke", headers=ADMIN)
    assert revoked.status_code == 200, revoked.text
    deadline = time.monotonic() + 1.5  # revocation must land within 1 s on every replica
    while _status_everywhere(gateways, rotated_key) != {401}:
        assert time.monotonic() < deadline, "a gateway still accepts the revoked key"
        time.sleep(0.05)
    refused = chat(gateways[0].url, old_key)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "key_revoked"
