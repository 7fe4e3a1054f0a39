"""The Makefile's install and test steps: ``make test`` checks the system packages the tests
drive first (one list, shared with .ci/run), and ``make venv`` takes torch's CPU wheel from the
PyTorch CPU index where that is reachable, else the plain pin at once."""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports import free_port

REPO = Path(__file__).resolve().parents[2]
PREREQS = REPO / "scripts" / "check_test_prereqs.sh"
TORCH = REPO / "scripts" / "install_torch_cpu.sh"


def _bare_path(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has only bash and id: no Chromium, PostgreSQL or Redis."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "id"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    return {"PATH": str(bin_dir), "PG_LIB_DIR": str(tmp_path / "no-postgresql")}


def test_missing_prerequisites_are_named_in_one_message_with_the_install_command(tmp_path):
    env = _bare_path(tmp_path)
    checked = subprocess.run(
        ["bash", str(PREREQS)], env=env, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 1
    message = checked.stderr.strip()
    assert len(message.splitlines()) == 1, message
    for package in ("chromium", "postgresql", "redis-server"):
        assert package in message
    assert "apt-get install -y chromium postgresql redis-server redis-tools" in message
    listed = subprocess.run(
        ["bash", str(PREREQS), "--missing-packages"], env=env, capture_output=True, text=True
    )
    assert listed.stdout.split() == ["chromium", "postgresql", "redis-server", "redis-tools"]


def test_this_machine_has_them_and_ci_and_make_test_use_the_one_list() -> None:
    checked = subprocess.run(["bash", str(PREREQS)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
    assert "scripts/check_test_prereqs.sh --missing-packages" in (REPO / ".ci" / "run").read_text()
    venv = os.environ.get("VENV", ".venv")
    # A fresh make, even when this suite runs under `make test` (a sub-make would print its
    # "Entering directory" lines and inherit the outer make's flags).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    planned = subprocess.run(  # -n: print the recipe only; -o: the venv taken as built
        ["make", "--no-print-directory", "-n", "-o", f"{venv}/bin/.installed", "test"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    ).stdout.splitlines()  # fmt: skip
    assert planned[0] == "bash scripts/check_test_prereqs.sh", planned
    assert "pytest" in planned[1]


@pytest.fixture
def fake_python(tmp_path: Path) -> Path:
    """A ``python`` that runs the script's probes for real and records its pip calls."""
    shim = tmp_path / "python"
    calls = tmp_path / "pip-calls"
    real = shutil.which("python3")
    shim.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "${{@:3}}" >> {calls}; exit 0; fi\n'
        f'exec {real} "$@"\n'
    )
    shim.chmod(0o755)
    return shim


@pytest.fixture
def cpu_index() -> Iterator[str]:
    """A loopback stand-in for the PyTorch CPU index: it answers /torch/."""

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/whl/cpu/torch/" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    finally:
        server.shutdown()
        server.server_close()


def _install(fake_python: Path, index: str) -> tuple[str, list[str]]:
    done = subprocess.run(
        ["bash", str(TORCH), str(fake_python), "torch==0.0.1", index],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYPI_INDEX": "https://pypi.example/simple"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    calls = fake_python.with_name("pip-calls")
    return done.stdout, calls.read_text().splitlines() if calls.exists() else []


def test_torch_comes_from_the_cpu_index_where_it_answers(fake_python, cpu_index) -> None:
    said, calls = _install(fake_python, cpu_index)
    assert "the CPU build" in said
    assert calls == [
        f"install -q --index-url {cpu_index} --extra-index-url https://pypi.example/simple "
        "torch==0.0.1"
    ]


def test_an_unreachable_cpu_index_falls_back_to_the_plain_pin(fake_python) -> None:
    nothing = f"http://127.0.0.1:{free_port()}/whl/cpu"  # refused at once
    said, calls = _install(fake_python, nothing)
    assert "not reachable" in said
    assert calls == ["install -q torch==0.0.1"]
