"""``switchyard serve`` as a real process: what it prints, what it keeps private, and the traps it
refuses to walk into (a second gateway on one DATA_DIR, a busy port, a replica whose key pepper
differs from its Redis's), plus what the unauthenticated /readyz and /metrics give away."""

from __future__ import annotations

import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis
from fake_upstream import FakeUpstream
from gateway_runner import REPO_ROOT
from marked_gateway import ADMIN_KEY, MarkedGateway, write_policy
from replica_load import chat

from gateway.access.keys import PEPPER_FINGERPRINT_KEY
from gateway.store.embedded import EmbeddedRedis

pytestmark = pytest.mark.slow


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _redis_children(data_dir: Path) -> list[int]:
    """Pids of redis-server processes working in ``data_dir``'s Redis directory (a Redis
    changes its command line, but its working directory is its ``--dir``)."""
    wanted = (data_dir / "redis").resolve()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "redis-server":
                continue
            if (entry / "cwd").resolve() == wanted:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _exits(gateway: MarkedGateway, timeout_s: float = 30) -> tuple[int, float, str]:
    """Start ``gateway`` expecting it to give up; (exit code, seconds it took, its output)."""
    gateway.data_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with gateway.log_path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve"],
            cwd=gateway.data_dir,
            env={**gateway.env, "PYTHONPATH": str(REPO_ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        code = process.wait(timeout_s)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return code, time.monotonic() - started, gateway.output()


def test_admin_key_is_printed_only_when_generated(tmp_path: Path, fake_upstream: FakeUpstream):
    gateway = MarkedGateway(tmp_path / "data", write_policy(tmp_path, fake_upstream.base_url))
    del gateway.env["SWITCHYARD_ADMIN_KEY"]
    gateway.start()
    gateway.stop()
    generated = (tmp_path / "data" / "admin_key").read_text().strip()
    first_run = gateway.output()
    assert f"Admin key (generated now): {generated}" in first_run
    assert _mode(tmp_path / "data" / "admin_key") == 0o600

    gateway.start()  # the same DATA_DIR: the key now comes from the file
    gateway.stop()
    second_run = gateway.output()[len(first_run) :]
    assert "Admin key: in " in second_run
    assert generated not in second_run


def test_data_dir_files_are_private(tmp_path: Path, fake_upstream: FakeUpstream) -> None:
    data = tmp_path / "data"
    # Left by an older version: a world-readable Redis directory and AOF.
    (data / "redis").mkdir(parents=True, mode=0o755)
    old_file = data / "redis" / "old-notes.txt"
    old_file.write_text("written before the 0600 rule")
    old_file.chmod(0o644)
    gateway = MarkedGateway(data, write_policy(tmp_path, fake_upstream.base_url)).start()
    try:
        _, key = gateway.create_key(name="modes")  # some writes for the AOF
        reply = chat(gateway.url, key)
        assert reply.status_code == 200
        time.sleep(1.2)  # appendfsync everysec
        for folder in (data, data / "redis", data / "spool"):
            assert _mode(folder) == 0o700, folder
        files = [p for p in (data / "redis").rglob("*") if p.is_file()]
        assert any("appendonly" in p.name for p in files), files
        for path in files:
            assert _mode(path) == 0o600, path
        for path in (data / "redis").rglob("*"):
            if path.is_dir():
                assert _mode(path) == 0o700, path
    finally:
        gateway.stop()


def test_second_serve_on_one_data_dir_exits_at_once(tmp_path: Path, fake_upstream: FakeUpstream):
    policy = write_policy(tmp_path, fake_upstream.base_url)
    first = MarkedGateway(tmp_path / "data", policy).start()
    try:
        _, key = first.create_key(name="survivor")
        assert first.process is not None
        redis_before = _redis_children(first.data_dir)
        assert len(redis_before) == 1

        second = MarkedGateway(tmp_path / "data", policy)
        second.log_path = tmp_path / "second.log"
        code, took_s, output = _exits(second)
        assert code != 0
        assert f"pid {first.process.pid}" in output and "SWITCHYARD_DATA_DIR" in output
        print(f"second serve on the same DATA_DIR exited {code} after {took_s:.2f}s")
        assert _redis_children(first.data_dir) == redis_before  # no second Redis, none stopped
        reply = chat(first.url, key)
        assert reply.status_code == 200, reply.text
    finally:
        first.stop()


def test_busy_port_exits_promptly_without_a_redis_child(
    tmp_path: Path, fake_upstream: FakeUpstream
):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        gateway = MarkedGateway(tmp_path / "data", write_policy(tmp_path, fake_upstream.base_url))
        gateway.port = taken.getsockname()[1]
        gateway.env["SWITCHYARD_PORT"] = str(gateway.port)
        code, took_s, output = _exits(gateway)
    assert code != 0
    assert f"cannot listen on 127.0.0.1:{gateway.port}" in output
    print(f"serve on a busy port exited {code} after {took_s:.2f}s")
    assert _redis_children(gateway.data_dir) == []
    assert not (gateway.data_dir / "redis" / "redis.sock").exists()  # Redis never started


def test_replica_with_another_pepper_refuses_to_start(
    own_redis: EmbeddedRedis, tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    policy = write_policy(tmp_path, fake_upstream.base_url)
    first = MarkedGateway(tmp_path / "a", policy, redis_url=own_redis.url).start()
    try:
        _, key = first.create_key(name="made-on-a")
        odd = MarkedGateway(tmp_path / "b", policy, redis_url=own_redis.url)
        odd.env["SWITCHYARD_KEY_PEPPER"] = "another-pepper-0123456789abcdef"
        code, _, output = _exits(odd)
        assert code != 0
        assert "SWITCHYARD_KEY_PEPPER differs" in output
        assert "another-pepper" not in output  # the message names the setting, not its value

        same = MarkedGateway(tmp_path / "c", policy, redis_url=own_redis.url).start()
        try:
            reply = chat(same.url, key)
            assert reply.status_code == 200, reply.text  # a key made on the first replica
        finally:
            same.stop()
    finally:
        first.stop()


def test_existing_deployment_adopts_the_first_pepper(
    own_redis: EmbeddedRedis, tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    policy = write_policy(tmp_path, fake_upstream.base_url)
    gateway = MarkedGateway(tmp_path / "a", policy, redis_url=own_redis.url).start()
    _, key = gateway.create_key(name="from-before-the-upgrade")
    gateway.stop()
    control = redis.Redis.from_url(own_redis.url)
    recorded = control.get(PEPPER_FINGERPRINT_KEY)
    assert recorded is not None and len(recorded) == 64
    control.delete(PEPPER_FINGERPRINT_KEY)  # as a Redis written by an older version
    try:
        gateway.start()
        assert control.get(PEPPER_FINGERPRINT_KEY) == recorded  # adopted again, same pepper
        assert '"event":"key_pepper_adopted"' in gateway.output().replace(" ", "")
        reply = chat(gateway.url, key)
        assert reply.status_code == 200, reply.text
    finally:
        gateway.stop()
        control.close()


def test_readyz_says_states_only_and_metrics_can_ask_for_a_token(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    policy = write_policy(tmp_path, fake_upstream.base_url)
    gateway = MarkedGateway(tmp_path / "data", policy, metrics_token="metrics-OPSTOKEN-42")
    gateway.start()
    try:
        secret = "sk-live-OPSSECRET-in-a-broken-policy"
        policy.write_text(f"providers:\n  x: {{base_url: [\n# api key {secret}\n")
        deadline = time.monotonic() + 10
        ready = httpx.get(gateway.base_url + "/readyz", timeout=5)
        while "policy_reload" not in ready.json()["checks"]:
            assert time.monotonic() < deadline, ready.text
            time.sleep(0.2)
            ready = httpx.get(gateway.base_url + "/readyz", timeout=5)
        assert ready.json()["checks"]["policy_reload"] == "failed"
        assert ready.json()["checks"]["policy"] == "ok"  # the last good policy still serves
        assert secret not in ready.text and "base_url" not in ready.text
        with gateway.admin() as admin:
            details = admin.get("/admin/health").json()["details"]
            assert details["policy"]["last_error"]["message"]
            assert admin.get("/admin/policy").json()["last_error"] is not None

        assert httpx.get(gateway.base_url + "/metrics", timeout=5).status_code == 401
        wrong = httpx.get(
            gateway.base_url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        )
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        scraped = httpx.get(
            gateway.base_url + "/metrics",
            headers={"Authorization": "Bearer metrics-OPSTOKEN-42"},
            timeout=5,
        )
        assert scraped.status_code == 200 and "switchyard_requests_total" in scraped.text
        assert "OPSTOKEN" not in gateway.output()
    finally:
        gateway.stop()


def test_refused_start_stops_its_embedded_redis(tmp_path: Path, fake_upstream: FakeUpstream):
    """The embedded Redis remembers the pepper too: a DATA_DIR whose pepper changed (a lost
    key_pepper file regenerated, a new SWITCHYARD_KEY_PEPPER) refuses to start, and the Redis it
    had started for the check is stopped again."""
    gateway = MarkedGateway(tmp_path / "data", write_policy(tmp_path, fake_upstream.base_url))
    gateway.start()
    gateway.stop()
    gateway.env["SWITCHYARD_KEY_PEPPER"] = "a-changed-pepper-0123456789abcdef"
    code, took_s, output = _exits(gateway)
    assert code == 3, output[-2000:]
    assert "error: the gateway did not start: SWITCHYARD_KEY_PEPPER differs" in output
    print(f"refused start exited {code} after {took_s:.2f}s")
    assert _redis_children(gateway.data_dir) == []
