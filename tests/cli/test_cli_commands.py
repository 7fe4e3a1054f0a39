"""Settings validation, generated secrets, and the ``switchyard`` CLI."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest
from gateway_runner import ADMIN_KEY, PEPPER, GatewayThread, RunningGateway, make_settings

from gateway.cli import build_parser, main
from gateway.ledger.audit import AuditQuery
from gateway.ledger.backends import open_audit_store
from gateway.settings import Settings, SettingsError, ensure_secrets, load_settings


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SWITCHYARD_PORT", "eighty"),
        ("SWITCHYARD_PORT", "70000"),
        ("SWITCHYARD_LIMITS_ON_REDIS_FAILURE", "sometimes"),
        ("SWITCHYARD_LOG_FORMAT", "xml"),
        ("SWITCHYARD_MAX_BODY_BYTES", "-1"),
        ("SWITCHYARD_UPSTREAM_READ_TIMEOUT_S", "0"),
        ("SWITCHYARD_ALERT_WEBHOOK_URL", "ftp://hooks.example"),
    ],
)
def test_bad_setting_names_the_variable(monkeypatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as caught:
        load_settings(_env_file=None)
    assert variable in str(caught.value)


def test_defaults(monkeypatch) -> None:
    for name in list(os.environ):
        if name.startswith("SWITCHYARD_"):
            monkeypatch.delenv(name)
    settings = load_settings(_env_file=None)
    assert (settings.host, settings.port, settings.redis_url) == ("127.0.0.1", 8080, "")
    assert settings.limits.on_redis_failure == "closed" and settings.log_format == "json"


def test_secrets_are_generated_once_with_mode_0600(tmp_path) -> None:
    settings = Settings(_env_file=None, data_dir=tmp_path)  # type: ignore[call-arg]
    first = ensure_secrets(settings)
    again = ensure_secrets(settings)
    assert first.admin_key_generated and not again.admin_key_generated
    assert first.admin_key == again.admin_key and first.key_pepper == again.key_pepper
    for name in ("admin_key", "key_pepper"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600


def test_serve_refuses_a_bad_setting(monkeypatch, capsys) -> None:
    monkeypatch.setenv("SWITCHYARD_PORT", "0")
    assert main(["serve"]) == 2
    assert "SWITCHYARD_PORT" in capsys.readouterr().err


def test_policy_check(tmp_path, fake_policy, capsys) -> None:
    assert main(["policy", "check", str(fake_policy)]) == 0
    assert capsys.readouterr().out.startswith("ok:")
    bad = tmp_path / "bad.yaml"
    bad.write_text("providers: {p: {base_url: 'http://x'}}\nmodels: {m: {provider: nowhere}}\n")
    assert main(["policy", "check", str(bad)]) == 1
    assert "models.m.provider" in capsys.readouterr().err


@pytest.fixture
def cli_env(monkeypatch, tmp_path, fake_policy, redis_url: str) -> None:
    """The CLI on the ``gateway`` fixture's Redis, pepper and policy, its data in ``tmp_path``."""
    monkeypatch.setenv("SWITCHYARD_REDIS_URL", redis_url)
    monkeypatch.setenv("SWITCHYARD_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("SWITCHYARD_KEY_PEPPER", PEPPER)
    monkeypatch.setenv("SWITCHYARD_POLICY_FILE", str(fake_policy))


def _cli_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return orjson.loads(capsys.readouterr().out)


def test_keys_cli_lifecycle_shares_the_store_with_the_gateway(
    monkeypatch, capsys, cli_env: None, gateway: RunningGateway
) -> None:
    created = _cli_json(
        capsys, "keys", "create", "--name", "cli", "--team", "ops", "--models", "fake",
        "--rpm", "60", "--metadata", "owner=ops",
    )  # fmt: skip
    key_id, key = created["id"], created["key"]
    assert created["rpm"] == 60 and created["metadata"] == {"owner": "ops"}
    assert _chat(gateway, key) == 200
    assert _cli_json(capsys, "keys", "show", key_id)["team"] == "ops"
    listed = _cli_json(capsys, "keys", "list", "--team", "ops", "--format", "json")
    assert key_id in {k["id"] for k in listed}
    updated = _cli_json(capsys, "keys", "update", key_id, "--tpm", "5000", "--clear", "rpm")
    assert updated["tpm"] == 5000 and updated["rpm"] is None
    rotated = _cli_json(capsys, "keys", "rotate", key_id, "--idempotency-key", "cli-1")
    assert rotated["key"] != key and _chat(gateway, rotated["key"]) == 200
    assert _cli_json(capsys, "keys", "revoke", key_id)["status"] == "revoked"

    assert main(["keys", "create", "--rpm", "-5"]) == 1
    assert "rpm" in capsys.readouterr().err
    assert main(["keys", "create", "--models", "nope"]) == 1
    assert "models[0]" in capsys.readouterr().err
    assert main(["keys", "show", "zzzzzzzzzzzzzzzz"]) == 1
    assert "no key" in capsys.readouterr().err

    # A CLI with another pepper would make keys no gateway of this Redis accepts: refused.
    monkeypatch.setenv("SWITCHYARD_KEY_PEPPER", "some-other-pepper-0123456789")
    assert main(["keys", "create", "--name", "orphan"]) == 2
    assert "SWITCHYARD_KEY_PEPPER differs" in capsys.readouterr().err


async def test_teams_and_tokens_cli_share_the_store_and_the_audit_log(
    capsys, tmp_path, cli_env: None, gateway: RunningGateway
) -> None:
    team = await asyncio.to_thread(
        _cli_json, capsys, "teams", "create", "cli-team", "--rpm", "3", "--budget-day", "1.5"
    )
    assert team["rpm"] == 3 and team["budgets_nanos"] == {"day": 1_500_000_000}
    key = await asyncio.to_thread(_cli_json, capsys, "keys", "create", "--team", "cli-team")
    chats = [_chat(gateway, key["key"]) for _ in range(4)]
    assert chats == [200, 200, 200, 429]  # the team's rpm, made by the CLI, holds at once
    shown = await asyncio.to_thread(_cli_json, capsys, "teams", "show", "cli-team")
    assert shown["usage"]["requests"]["used"] == 3
    cleared = await asyncio.to_thread(
        _cli_json, capsys, "teams", "update", "cli-team", "--clear", "rpm"
    )
    assert cleared["rpm"] is None and _chat(gateway, key["key"]) == 200
    alerting = await asyncio.to_thread(
        _cli_json, capsys, "teams", "update", "cli-team", "--budget-mode", "soft",
        "--alert-thresholds", "80,50",
    )  # fmt: skip
    assert (alerting["budget_mode"], alerting["alert_thresholds"]) == ("soft", [50, 80])
    assert (
        await asyncio.to_thread(main, ["teams", "update", "cli-team", "--alert-thresholds", "0"])
        == 1
    )
    assert "alert_thresholds" in capsys.readouterr().err

    token = await asyncio.to_thread(
        _cli_json, capsys, "tokens", "create", "--name", "ci-viewer", "--role", "viewer"
    )
    bearer = {"Authorization": f"Bearer {token['token']}"}
    assert httpx.get(gateway.base_url + "/admin/usage", headers=bearer).status_code == 200
    assert httpx.get(gateway.base_url + "/admin/keys", headers=bearer).status_code == 403
    await asyncio.to_thread(_cli_json, capsys, "tokens", "revoke", token["id"])
    assert httpx.get(gateway.base_url + "/admin/usage", headers=bearer).status_code == 403

    assert await asyncio.to_thread(main, ["teams", "delete", "cli-team"]) == 1
    assert "still has 1 key" in capsys.readouterr().err
    await asyncio.to_thread(_cli_json, capsys, "keys", "update", key["id"], "--clear", "team")
    assert (await asyncio.to_thread(_cli_json, capsys, "teams", "delete", "cli-team"))["deleted"]

    store = await open_audit_store("", data_dir=tmp_path)
    try:
        page = await store.query(AuditQuery(limit=100))
    finally:
        await store.close()
    assert {e.actor_kind for e in page.entries} == {"cli"}
    assert [e.action for e in reversed(page.entries)] == [
        "team.create", "key.create", "team.update", "team.update", "token.create", "token.revoke",
        "key.update", "team.delete",
    ]  # fmt: skip
    assert token["token"] not in str(page.entries) and key["key"] not in str(page.entries)


def _chat(gateway: RunningGateway, secret: str) -> int:
    return httpx.post(
        gateway.v1 + "/chat/completions",
        json={"model": "fake", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {secret}"},
    ).status_code


def _helps(parser, path=()):
    """Every parser's --help text, the subcommands' too."""
    yield path, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _helps(sub, (*path, name))


def test_help_is_plain_text() -> None:
    helps = dict(_helps(build_parser()))
    assert ("policy", "apply") in helps and ("keys", "list") in helps
    for path, text in helps.items():
        assert "``" not in text and ":class:" not in text, (path, text)
    assert helps[()].splitlines()[2].startswith("Switchyard, a self-hosted LLM gateway")


def test_keys_list_is_a_table_unless_json(capsys, cli_env: None, gateway: RunningGateway) -> None:
    created = _cli_json(
        capsys, "keys", "create", "--name", "table-key", "--team", "tabled", "--rpm", "60",
        "--budget-usd", "50", "--budget-period", "month",
    )  # fmt: skip
    assert main(["keys", "list", "--team", "tabled"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "id", "name", "team", "status", "models", "rpm", "tpm", "budget", "created",
    ]  # fmt: skip
    assert set(lines[1]) == {"-", " "}
    row = lines[2].split()
    assert row[:6] == [created["id"], "table-key", "tabled", "active", "(all)", "60"]
    assert row[6:8] == ["-", "$50.00/month"] and lines[-1] == "1 keys"
    listed = _cli_json(capsys, "keys", "list", "--team", "tabled", "--format", "json")
    assert [k["id"] for k in listed] == [created["id"]]


def _cli_env(tmp_path: Path, redis_url: str, policy: Path) -> dict[str, str]:
    root = Path(__file__).resolve().parents[2]
    return {
        **os.environ,
        "PYTHONPATH": str(root),
        "SWITCHYARD_REDIS_URL": redis_url,
        "SWITCHYARD_DATA_DIR": str(tmp_path),
        "SWITCHYARD_KEY_PEPPER": PEPPER,
        "SWITCHYARD_POLICY_FILE": str(policy),
    }


@pytest.mark.parametrize(
    "argv", [("usage", "report", "--format", "json"), ("keys", "list")], ids=["usage", "keys"]
)
def test_a_closed_stdout_ends_the_command_quietly(
    tmp_path, redis_url: str, fake_policy: Path, gateway: RunningGateway, argv
) -> None:
    """``switchyard usage report --format json | head -1``: the reader goes before the
    command writes. Unix tools then end quietly with status 0 (not "cannot reach Redis")."""
    gateway.create_key(name="so-keys-list-prints-a-row")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command starts
    try:
        finished = subprocess.run(
            [sys.executable, "-m", "gateway", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=_cli_env(tmp_path, redis_url, fake_policy),
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    stderr = finished.stderr.decode()
    assert finished.returncode == 0, stderr
    assert "Broken pipe" not in stderr and "error" not in stderr.lower(), stderr


@pytest.fixture
def policy_gateway(tmp_path, fake_policy: Path, redis_url: str):
    """A gateway on its own copy of the policy file, which the policy commands change."""
    copy = tmp_path / "routing_rules.yaml"
    shutil.copy(fake_policy, copy)
    with GatewayThread(make_settings(tmp_path / "gw", copy, redis_url)) as running:
        yield running


def test_policy_get_diff_apply_go_through_the_admin_api(
    capsys, monkeypatch, tmp_path, policy_gateway: RunningGateway
) -> None:
    monkeypatch.setenv("SWITCHYARD_DATA_DIR", str(tmp_path / "cli"))
    monkeypatch.setenv("SWITCHYARD_ADMIN_KEY", ADMIN_KEY)
    url = ("--url", policy_gateway.base_url)
    live_file = policy_gateway.settings.policy_file
    in_force = live_file.read_text()
    assert main(["policy", "get", *url]) == 0
    assert capsys.readouterr().out == in_force

    proposed = tmp_path / "proposed.yaml"
    proposed.write_text("# tried from the CLI\n" + in_force)
    assert main(["policy", "diff", str(proposed), *url]) == 0
    out = capsys.readouterr().out
    assert "--- policy in force" in out and "+# tried from the CLI" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(in_force + "default_task: nowhere\n")
    for command in ("diff", "apply"):
        assert main(["policy", command, str(bad), *url]) == 1
        err = capsys.readouterr().err
        assert "400 (default_task)" in err, err
    assert live_file.read_text() == in_force  # nothing applied

    version = policy_gateway.services.policies.current.version
    assert main(["policy", "apply", str(proposed), *url]) == 0
    assert capsys.readouterr().out.startswith(f"applied: {proposed}: version ")
    assert live_file.read_text() == proposed.read_text()
    assert policy_gateway.services.policies.current.version != version
    assert main(["policy", "diff", str(proposed), *url]) == 0
    assert "no changes" in capsys.readouterr().out
    with policy_gateway.admin() as admin:
        audit = admin.get("/admin/audit", params={"action": "policy.put"}).json()
    assert [entry["action"] for entry in audit["data"]] == ["policy.put"]

    assert main(["policy", "get", "--url", policy_gateway.base_url, "--admin-key", "x" * 20]) == 1
    assert "the gateway refused it: 403" in capsys.readouterr().err
