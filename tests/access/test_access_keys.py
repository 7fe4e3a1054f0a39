"""The key lifecycle through the admin API: create, list, show, update, rotate, revoke."""

from __future__ import annotations

import hashlib
import hmac
import time

import httpx
import openai
import pytest
import redis
from gateway_runner import ADMIN_KEY, PEPPER, GatewayThread, RunningGateway, make_settings

from gateway.access.keys import (
    PEPPER_FINGERPRINT_KEY,
    format_key,
    parse_key,
    pepper_fingerprint,
    record_key,
    rotation_secret,
)

HI = [{"role": "user", "content": "hi"}]


def _chat(gateway: RunningGateway, key: str, model: str = "fake") -> httpx.Response:
    return httpx.post(
        gateway.v1 + "/chat/completions",
        json={"model": model, "messages": HI},
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )


def test_admin_endpoints_need_the_admin_key(gateway: RunningGateway, key: str) -> None:
    assert httpx.get(gateway.base_url + "/admin/keys").status_code == 401
    for wrong in (key, "not-the-admin-key"):
        response = httpx.get(
            gateway.base_url + "/admin/keys", headers={"Authorization": f"Bearer {wrong}"}
        )
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "admin_key_required"


def test_create_shows_the_secret_once_and_stores_only_its_hmac(
    gateway: RunningGateway, redis_url: str
) -> None:
    with gateway.admin() as admin:
        created = admin.post(
            "/admin/keys",
            json={
                "name": "billing",
                "team": "payments",
                "models": ["fake", "other-model"],
                "rpm": 100,
                "tpm": 10000,
                "budget_usd": 5,
                "metadata": {"owner": "ana"},
            },
        )
        assert created.status_code == 201
        body = created.json()
        parsed = parse_key(body["key"])
        assert parsed is not None and parsed[0] == body["id"]
        assert body["budget_period"] == "month" and body["status"] == "active"
        shown = admin.get(f"/admin/keys/{body['id']}").json()
    assert "key" not in shown and shown["models"] == ["fake", "other-model"]
    secret = parsed[1]
    stored = redis.Redis.from_url(redis_url).hgetall(record_key(body["id"]))
    assert all(secret.encode() not in value for value in stored.values())
    expected = hmac.new(PEPPER.encode(), secret.encode(), hashlib.sha256).hexdigest()
    assert stored[b"secret_hash"].decode() == expected
    assert _chat(gateway, body["key"]).status_code == 200


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"rpm": -1}, "rpm"),
        ({"rpm": "10"}, "rpm"),
        ({"tpm": 10**13}, "tpm"),
        ({"budget_usd": -0.5}, "budget_usd"),
        # Budgets are whole nano-dollars, and small enough that the limiter stays exact.
        ({"budget_usd": 0.0000000001}, "budget_usd"),
        ({"budget_usd": 9_000_000.5}, "budget_usd"),
        ({"budget_period": "fortnight"}, "budget_period"),
        ({"models": ["fake", "nope"]}, "models[1]"),
        ({"models": "fake"}, "models"),
        ({"colour": "blue"}, "colour"),
        ({"expires_at": "next tuesday"}, "expires_at"),
        ({"expires_at": 1000}, "expires_at"),
        ({"metadata": {"big": "x" * 5000}}, "metadata"),
        ({"name": ""}, "name"),
    ],
)
def test_malformed_create_names_the_field(
    gateway: RunningGateway, payload: dict, param: str
) -> None:
    with gateway.admin() as admin:
        response = admin.post("/admin/keys", json=payload)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_list_paginates_and_filters(gateway: RunningGateway) -> None:
    team = f"team-{time.monotonic_ns()}"
    ids = [gateway.create_key(name=f"k{i}", team=team)[0] for i in range(3)]
    with gateway.admin() as admin:
        first = admin.get("/admin/keys", params={"team": team, "limit": 2}).json()
        assert [k["id"] for k in first["data"]] == ids[:2] and first["has_more"] is True
        rest = admin.get(
            "/admin/keys", params={"team": team, "limit": 2, "after": first["last_id"]}
        ).json()
        assert [k["id"] for k in rest["data"]] == ids[2:] and rest["has_more"] is False
        admin.post(f"/admin/keys/{ids[1]}/revoke")
        revoked = admin.get("/admin/keys", params={"team": team, "status": "revoked"}).json()
        assert [k["id"] for k in revoked["data"]] == [ids[1]]
        assert admin.get("/admin/keys", params={"limit": 0}).json()["error"]["param"] == "limit"
        assert admin.get("/admin/keys", params={"status": "x"}).status_code == 400


def test_unknown_ids_are_404(gateway: RunningGateway) -> None:
    missing = "a" * 16
    with gateway.admin() as admin:
        assert admin.get(f"/admin/keys/{missing}").status_code == 404
        assert admin.patch(f"/admin/keys/{missing}", json={"rpm": 1}).status_code == 404
        assert admin.post(f"/admin/keys/{missing}/rotate", json={}).status_code == 404
        assert admin.post(f"/admin/keys/{missing}/revoke").status_code == 404
        assert admin.get("/admin/keys/short").status_code == 404


def test_update_takes_effect_on_the_next_request(gateway: RunningGateway) -> None:
    key_id, key = gateway.create_key(name="before", rpm=50)
    assert _chat(gateway, key, "other").status_code == 200
    with gateway.admin() as admin:
        patched = admin.patch(
            f"/admin/keys/{key_id}", json={"name": "after", "models": ["fake"], "rpm": None}
        )
        assert patched.status_code == 200
        body = patched.json()
        assert body["name"] == "after" and body["rpm"] is None and body["models"] == ["fake"]
        refused = _chat(gateway, key, "other")
        assert refused.status_code == 403
        assert _chat(gateway, key, "fake").status_code == 200
        bad = admin.patch(f"/admin/keys/{key_id}", json={"tpm": -5})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tpm"
        admin.patch(f"/admin/keys/{key_id}", json={"expires_at": time.time() - 1})
    expired = _chat(gateway, key)
    assert expired.status_code == 401
    assert expired.json()["error"]["code"] == "key_expired"


def test_rotation_grace_then_old_secret_fails(gateway: RunningGateway) -> None:
    key_id, old = gateway.create_key(name="rotating", rpm=1000)
    with gateway.admin() as admin:
        rotated = admin.post(f"/admin/keys/{key_id}/rotate", json={"grace_seconds": 1})
    assert rotated.status_code == 200
    new = rotated.json()["key"]
    assert new != old and rotated.json()["id"] == key_id and rotated.json()["rpm"] == 1000
    assert _chat(gateway, old).status_code == 200
    assert _chat(gateway, new).status_code == 200
    time.sleep(1.1)
    assert _chat(gateway, old).status_code == 401
    client = openai.OpenAI(base_url=gateway.v1, api_key=new, max_retries=0)
    assert client.chat.completions.create(model="fake", messages=HI).choices  # type: ignore[arg-type]


def test_rotation_is_idempotent_by_header(gateway: RunningGateway) -> None:
    key_id, _ = gateway.create_key(name="idem")
    with gateway.admin() as admin:
        url = f"/admin/keys/{key_id}/rotate"
        first = admin.post(url, json={"grace_seconds": 0}, headers={"Idempotency-Key": "r-1"})
        again = admin.post(url, json={"grace_seconds": 0}, headers={"Idempotency-Key": "r-1"})
        other = admin.post(url, headers={"Idempotency-Key": "r-2"})
        audited = admin.get("/admin/audit", params={"target": f"key:{key_id}"}).json()["data"]
    assert first.status_code == again.status_code == other.status_code == 200
    # The replay answered again and changed nothing: one audit entry per rotation done.
    assert [entry["action"] for entry in audited].count("key.rotate") == 2
    assert first.json()["key"] == again.json()["key"] != other.json()["key"]
    assert _chat(gateway, other.json()["key"]).status_code == 200
    assert _chat(gateway, first.json()["key"]).status_code == 401


def test_reused_idempotency_key_after_expiry_never_revives_a_secret(
    gateway: RunningGateway, redis_url: str
) -> None:
    """S1 (Idempotency-Key rot-42) -> S2 -> rot-42 again once its record expired: a new S3,
    and S1 stays refused. Inside the window, a replay gets the same answer and rotates nothing."""
    key_id, _ = gateway.create_key(name="revival")
    url = f"/admin/keys/{key_id}/rotate"
    with gateway.admin() as admin:
        first = admin.post(url, json={"grace_seconds": 0}, headers={"Idempotency-Key": "rot-42"})
        replay = admin.post(url, json={"grace_seconds": 0}, headers={"Idempotency-Key": "rot-42"})
        assert first.status_code == replay.status_code == 200
        s1 = first.json()["key"]
        assert replay.json()["key"] == s1
        assert replay.json()["rotated_at"] == first.json()["rotated_at"]  # no second rotation
        assert _chat(gateway, s1).status_code == 200
        s2 = admin.post(url, json={"grace_seconds": 0}).json()["key"]
        assert _chat(gateway, s1).status_code == 401
        # The 24 h idempotency record expires (deleted here, as its TTL would).
        with redis.Redis.from_url(redis_url) as raw:
            records = list(raw.scan_iter(match=f"{record_key(key_id)}:rotate:*"))
            assert records and raw.delete(*records) == len(records)
        third = admin.post(url, json={"grace_seconds": 0}, headers={"Idempotency-Key": "rot-42"})
    assert third.status_code == 200
    s3 = third.json()["key"]
    assert s3 not in (s1, s2)
    assert _chat(gateway, s1).status_code == 401
    assert _chat(gateway, s2).status_code == 401
    assert _chat(gateway, s3).status_code == 200


def test_a_replay_of_a_rotation_made_before_nonces_still_gets_its_secret(
    gateway: RunningGateway, redis_url: str
) -> None:
    """An idempotency record written by an older gateway (the new hash alone, its secret
    derived from the key's rotation_salt) is replayed with that secret while it lives."""
    key_id, _ = gateway.create_key(name="upgraded")
    idem_key = f"{record_key(key_id)}:rotate:" + hashlib.sha256(b"rot-7").hexdigest()
    with redis.Redis.from_url(redis_url) as raw:
        salt = raw.hget(record_key(key_id), "rotation_salt").decode()  # type: ignore[union-attr]
        old_secret = rotation_secret(PEPPER.encode(), key_id, salt, "rot-7")
        old_hash = hmac.new(PEPPER.encode(), old_secret.encode(), hashlib.sha256).hexdigest()
        raw.hset(record_key(key_id), "secret_hash", old_hash)  # what that rotation installed
        raw.set(idem_key, old_hash, ex=60)
    with gateway.admin() as admin:
        replay = admin.post(f"/admin/keys/{key_id}/rotate", headers={"Idempotency-Key": "rot-7"})
    assert replay.status_code == 200
    assert replay.json()["key"] == format_key(key_id, old_secret)
    assert _chat(gateway, replay.json()["key"]).status_code == 200


def test_rotating_a_revoked_key_is_409(gateway: RunningGateway) -> None:
    key_id, _ = gateway.create_key(name="gone")
    with gateway.admin() as admin:
        assert admin.post(f"/admin/keys/{key_id}/revoke").json()["status"] == "revoked"
        conflict = admin.post(f"/admin/keys/{key_id}/rotate", json={"grace_seconds": 5})
        assert conflict.status_code == 409
        bad = admin.post(f"/admin/keys/{key_id}/rotate", json={"grace_seconds": -1})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "grace_seconds"


def test_revocation_reaches_every_replica_within_a_second(
    gateway: RunningGateway, tmp_path, fake_policy, redis_url: str
) -> None:
    replica = GatewayThread(make_settings(tmp_path, fake_policy, redis_url))
    other = replica.start()
    try:
        key_id, key = gateway.create_key(name="shared")
        assert _chat(gateway, key).status_code == 200
        assert _chat(other, key).status_code == 200  # both replicas now hold it in cache
        with gateway.admin() as admin:
            assert admin.post(f"/admin/keys/{key_id}/revoke").status_code == 200
        revoked_at = time.monotonic()
        while _chat(other, key).status_code != 401:
            assert time.monotonic() - revoked_at < 1.0, "replica still serves a revoked key"
            time.sleep(0.02)
        refused = _chat(gateway, key)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "key_revoked"
    finally:
        replica.stop()


def test_expired_key_is_401_saying_so(gateway: RunningGateway) -> None:
    _, key = gateway.create_key(name="short-lived", expires_at=time.time() + 0.6)
    assert _chat(gateway, key).status_code == 200
    time.sleep(0.7)
    response = _chat(gateway, key)
    assert response.status_code == 401
    assert "expired" in response.json()["error"]["message"]


def test_iso_expiry_and_admin_key_is_not_an_api_key(gateway: RunningGateway) -> None:
    _, key = gateway.create_key(name="iso", expires_at="2999-01-01T00:00:00Z")
    assert _chat(gateway, key).status_code == 200
    assert _chat(gateway, ADMIN_KEY).status_code == 401


def test_pepper_checked_late_when_redis_was_away_at_start(own_redis, fake_policy, tmp_path):
    """Redis down at start: the gateway starts (unready), and checks the pepper as soon as Redis
    answers; another pepper's fingerprint there makes it unready (`key_pepper: mismatch`) with an
    error naming the setting, instead of answering 401 to every key."""
    control = redis.Redis.from_url(own_redis.url)
    control.set(PEPPER_FINGERPRINT_KEY, pepper_fingerprint(b"another-replica-pepper-0123"))
    control.close()
    own_redis.stop()  # SIGTERM: the AOF keeps the foreign fingerprint
    runner = GatewayThread(make_settings(tmp_path / "gw", fake_policy, own_redis.url))
    gateway = runner.start()
    try:
        assert "key_pepper_unchecked" in gateway.log.getvalue()
        own_redis.start()
        deadline = time.monotonic() + 10
        while "key_pepper_mismatch" not in gateway.log.getvalue():
            assert time.monotonic() < deadline, gateway.log.getvalue()[-2000:]
            time.sleep(0.1)
        ready = httpx.get(gateway.base_url + "/readyz", timeout=5)
        assert ready.status_code == 503 and ready.json()["checks"]["key_pepper"] == "mismatch"
        assert ready.json()["checks"]["redis"] == "ok"
        assert "SWITCHYARD_KEY_PEPPER differs" in gateway.log.getvalue()
    finally:
        runner.stop()
