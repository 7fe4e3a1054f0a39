"""Everything the gateway writes under DATA_DIR is private, as docs/configuration.md says:
folders 0700, files 0600 (the usage store and its -wal/-shm, the embedded Redis's files, the
spools, the generated secrets, the lock), whatever the umask it was started with."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from gateway_runner import GatewayProcess
from private_modes import private_modes_problems

pytestmark = pytest.mark.slow


def test_a_fresh_data_dir_stays_private_after_serving(tmp_path: Path, fake_policy: Path) -> None:
    data_dir = tmp_path / "var"
    # generated secrets (no admin key or pepper given), the usual 022 umask of a shell
    gateway = GatewayProcess(
        data_dir, fake_policy, env={"SWITCHYARD_ADMIN_KEY": "", "SWITCHYARD_KEY_PEPPER": ""}
    )
    gateway.log_path = tmp_path / "gateway.log"  # the test's own file, not the gateway's
    previous = os.umask(0o022)
    try:
        gateway.start()
    finally:
        os.umask(previous)
    try:
        gateway.admin_key = (data_dir / "admin_key").read_text().strip()
        _, key = gateway.create_key(name="modes")  # also an audit event in the SQL store
        answered = httpx.post(
            gateway.base_url + "/v1/chat/completions",
            json={"model": "fake", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert answered.status_code == 200, answered.text
        gateway.wait_exported()  # the usage event is in usage.sqlite3 now
        written = {p.relative_to(data_dir).as_posix() for p in data_dir.rglob("*")}
        for expected in (
            "admin_key",
            "key_pepper",
            "serve.lock",
            "redis/appendonly.aof",
            "usage",
            "usage/usage.sqlite3",
            "usage/usage.sqlite3-wal",
            "spool",
        ):
            assert expected in written, sorted(written)
        assert private_modes_problems(data_dir) == []
    finally:
        gateway.stop()
    assert private_modes_problems(data_dir) == []  # and what shutdown wrote last
