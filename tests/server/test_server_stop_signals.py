"""Ctrl-C and SIGTERM stop ``switchyard serve`` cleanly: exit status 0 once drained, no
traceback, and ``make run`` (which execs the server) reports no failed recipe."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from fake_upstream import FakeUpstream
from gateway_runner import REPO_ROOT, GatewayProcess
from ports import free_port

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_serve_exits_0_on_a_stop_signal(
    tmp_path: Path, fake_policy: Path, stop: signal.Signals
) -> None:
    gateway = GatewayProcess(tmp_path / "gw", fake_policy).start()
    try:
        _, key = gateway.create_key(name="stop")
        answered = httpx.post(
            gateway.base_url + "/v1/chat/completions",
            json={"model": "fake", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert answered.status_code == 200
        assert gateway.process is not None
        gateway.process.send_signal(stop)
        assert gateway.wait(60) == 0, gateway.output()
    finally:
        gateway.stop()
    output = gateway.output()
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output


def _wait_ready(process: subprocess.Popen[str], base_url: str, log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        try:
            if httpx.get(base_url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"make run did not come up:\n{log.read_text()}")


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "SIGTERM"])
def test_make_run_stops_without_a_failed_recipe(
    tmp_path: Path, fake_policy: Path, fake_upstream: FakeUpstream, stop: signal.Signals
) -> None:
    """The signal goes to make's whole process group, as a terminal's Ctrl-C does. ``-o``:
    the venv is taken as built (this test must not install anything)."""
    venv = os.environ.get("VENV", ".venv")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
    env.update(
        SWITCHYARD_PORT=str(port),
        SWITCHYARD_DATA_DIR=str(tmp_path / "var"),
        SWITCHYARD_POLICY_FILE=str(fake_policy),
        PYTHONPATH=str(REPO_ROOT),  # this checkout's code behind the venv's console script
    )
    log = tmp_path / "make.log"
    with log.open("w") as out:
        make = subprocess.Popen(
            ["make", "--no-print-directory", "-o", f"{venv}/bin/.installed", "run"],
            cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
    try:
        _wait_ready(make, f"http://127.0.0.1:{port}", log)
        os.killpg(make.pid, stop)
        make.wait(60)
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait(10)
    output = log.read_text()
    assert "make: ***" not in output, output
    assert "Traceback" not in output, output
    assert "Switchyard on http://127.0.0.1" in output
