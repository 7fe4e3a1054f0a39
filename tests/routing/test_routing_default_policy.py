"""With no policy file, the shipped default policy (packaged in the wheel) is served and said;
``switchyard init`` writes an editable copy, and the file, once there, takes over."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.policy.store import PolicyStore
from gateway.settings import SHIPPED_POLICY, load_settings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def empty_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith("SWITCHYARD_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SWITCHYARD_DATA_DIR", str(tmp_path / "var"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_repository_policy_is_the_shipped_one_a_single_copy() -> None:
    assert (REPO / "routing_rules.yaml").resolve() == SHIPPED_POLICY.resolve()
    assert SHIPPED_POLICY.parent == REPO / "gateway" / "policy"


def test_no_policy_file_serves_the_shipped_default_until_one_appears(empty_dir: Path) -> None:
    settings = load_settings(_env_file=None)
    assert settings.policy_fallback == SHIPPED_POLICY
    assert settings.policy_source == SHIPPED_POLICY
    store = PolicyStore(settings.policy_file, fallback=settings.policy_fallback)
    loaded = store.load()
    assert loaded.source == f"{SHIPPED_POLICY} (shipped default)"
    assert loaded.policy.resolve_model("local") == "local-smollm2"
    assert store.poll_once() is False and store.last_error is None  # no file: no error

    assert main(["init"]) == 0
    assert store.poll_once() is True  # the copy takes over, though its text is the same
    assert store.current.source == "routing_rules.yaml"
    assert not store.serving_fallback
    assert load_settings(_env_file=None).policy_fallback is None


def test_a_policy_edit_while_serving_the_default_creates_the_file(empty_dir: Path) -> None:
    store = PolicyStore(Path("routing_rules.yaml"), fallback=SHIPPED_POLICY)
    store.load()
    text = SHIPPED_POLICY.read_text().replace("timeout_s: 120", "timeout_s: 90", 1)
    store.write(text)
    assert (empty_dir / "routing_rules.yaml").read_text() == text
    assert store.current.source == "admin api" and not store.serving_fallback


def test_a_named_policy_file_must_exist(empty_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("SWITCHYARD_POLICY_FILE", str(empty_dir / "missing.yaml"))
    assert load_settings(_env_file=None).policy_fallback is None
    served = subprocess.run(  # its own process: serve configures logging process-wide
        [sys.executable, "-m", "gateway", "serve"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert served.returncode == 1
    assert "cannot read policy file" in served.stderr and "missing.yaml" in served.stderr


def test_init_writes_the_default_and_refuses_to_overwrite(empty_dir: Path, capsys) -> None:
    assert main(["init"]) == 0
    written = empty_dir / "routing_rules.yaml"
    assert written.read_text() == SHIPPED_POLICY.read_text()
    assert stat.S_IMODE(written.stat().st_mode) == 0o644  # no secrets in it; readable to edit
    assert "wrote routing_rules.yaml" in capsys.readouterr().out

    written.write_text("# mine\n")
    assert main(["init"]) == 1
    refused = capsys.readouterr().err
    assert "exists" in refused and "--force" in refused
    assert written.read_text() == "# mine\n"
    assert main(["init", "--force"]) == 0
    assert written.read_text() == SHIPPED_POLICY.read_text()
    assert not list(empty_dir.glob(".routing_rules.yaml.*"))  # no temporary file left
