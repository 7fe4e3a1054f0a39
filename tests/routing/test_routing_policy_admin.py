"""The policy admin endpoints of a real gateway (uvicorn on a thread, real Redis)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from gateway_runner import ADMIN_KEY, GatewayThread, make_settings


def _without_the_engine(data: dict[str, Any]) -> dict[str, Any]:
    """The base policy minus its local provider: these tests need no engine loaded."""
    del data["providers"]["home"], data["models"]["tiny"]
    data["tasks"]["chat"]["fallbacks"] = []
    return data


@pytest.fixture
async def admin(
    policy_data: Callable[..., dict[str, Any]],
    policy_file: Callable[[dict[str, Any]], Path],
    tmp_path: Path,
    redis_url: str,
) -> AsyncIterator[httpx.AsyncClient]:
    path = policy_file(_without_the_engine(policy_data()))
    runner = GatewayThread(make_settings(tmp_path / "gw", path, redis_url))
    gateway = runner.start()
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    try:
        async with httpx.AsyncClient(base_url=gateway.base_url, headers=headers) as client:
            client.store = gateway.services.policies  # type: ignore[attr-defined]
            client.path = path  # type: ignore[attr-defined]
            yield client
    finally:
        runner.stop()


async def test_get_policy_shows_version_and_policy(admin) -> None:
    response = await admin.get("/admin/policy")
    assert response.status_code == 200
    data = response.json()
    assert data["version"] == admin.store.current.version
    assert data["last_error"] is None and data["source"] == str(admin.path)
    assert data["policy"]["canaries"] == []
    assert data["policy"]["models"]["big"]["price"]["output"] == 8.0


async def test_put_yaml_applies_and_writes_the_file(admin, policy_data) -> None:
    text = "# new\n" + yaml.safe_dump(_without_the_engine(policy_data(default_task="save")))
    response = await admin.put(
        "/admin/policy", content=text, headers={"content-type": "application/yaml"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["version"] == admin.store.current.version
    assert admin.store.policy.default_task == "save" and admin.path.read_text() == text


async def test_put_json_applies(admin, policy_data) -> None:
    data = _without_the_engine(policy_data(canaries=[{"from": "big", "to": "other", "percent": 5}]))
    response = await admin.put("/admin/policy", json=data)
    assert response.status_code == 200
    assert admin.store.policy.canaries[0].percent == 5
    assert yaml.safe_load(admin.path.read_text())["canaries"][0]["from"] == "big"


async def test_put_invalid_is_refused_with_the_path(admin, policy_data) -> None:
    before = admin.path.read_text()
    version = admin.store.current.version
    data = _without_the_engine(policy_data())
    data["fallbacks"]["other"] = ["big"]
    response = await admin.put("/admin/policy", json=data)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_policy" and error["type"] == "invalid_request_error"
    assert error["param"].startswith("fallbacks.") and "cycle" in error["message"]
    assert admin.path.read_text() == before and admin.store.current.version == version
    bad_json = await admin.put(
        "/admin/policy", content=b"{", headers={"content-type": "application/json"}
    )
    assert bad_json.status_code == 400 and "invalid JSON" in bad_json.json()["error"]["message"]


async def test_validate_is_a_dry_run(admin, policy_data) -> None:
    version = admin.store.current.version
    ok = await admin.post(
        "/admin/policy/validate", json=_without_the_engine(policy_data(default_task="mix"))
    )
    assert ok.status_code == 200 and ok.json()["valid"] is True
    assert admin.store.current.version == version
    bad = await admin.post("/admin/policy/validate", content=b"models: {x: {provider: nope}}")
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "providers"


async def test_explain_lists_candidates_with_reasons_and_health(admin) -> None:
    response = await admin.post(
        "/admin/route/explain",
        json={
            "body": {"messages": [{"role": "user", "content": "hi"}]},
            "headers": {"X-Task-Type": "code"},
            "allowed_models": ["small", "other", "wordy"],
        },
    )
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["task"] == "code" and data["strategy"] == "cheapest"
    assert [c["model"] for c in data["candidates"]] == ["small", "other"]
    assert data["candidates"][0]["reason"].startswith("cheapest: est $")
    assert data["candidates"][1]["reason"] == "fallback of small"
    skipped = {c["model"]: c["reason"] for c in data["skipped"]}
    assert "over max" in skipped["big"]
    assert data["health"][0]["verdict"] == "would try"
    assert data["header"].startswith("task=code; strategy=cheapest; reason=cheapest")


async def test_explain_errors_use_the_envelope(admin) -> None:
    denied = await admin.post(
        "/admin/route/explain", json={"body": {"model": "big"}, "allowed_models": ["other"]}
    )
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "model_not_allowed"
    unknown = await admin.post("/admin/route/explain", json={"body": {"model": "gpt-99"}})
    assert unknown.status_code == 404
    bad = await admin.post("/admin/route/explain", content=json.dumps({"body": [1]}))
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "body"
    empty = await admin.post("/admin/route/explain", content=b"")
    assert empty.status_code == 400


async def test_a_json_put_keeps_the_files_comments(admin) -> None:
    """GET's policy with one field changed, PUT back as JSON: the file's comments stay and
    only that line changes (issue 27: the file was rewritten as machine YAML)."""
    original = "# the team's routing policy\n" + admin.path.read_text().replace(
        "default_task:", "# which task a request without X-Task-Type gets\ndefault_task:", 1
    )
    put = await admin.put(
        "/admin/policy", content=original, headers={"content-type": "application/yaml"}
    )
    assert put.status_code == 200, put.text
    policy = (await admin.get("/admin/policy")).json()["policy"]
    policy["models"]["big"]["price"]["output"] = 9.0
    response = await admin.put("/admin/policy", json=policy)
    assert response.status_code == 200, response.text
    after = admin.path.read_text()
    assert after.startswith("# the team's routing policy\n")
    assert "# which task a request without X-Task-Type gets\n" in after
    changed = set(original.splitlines()) ^ set(after.splitlines())
    assert len(changed) == 2 and any("9.0" in line for line in changed), changed
    assert admin.store.policy.models["big"].price.output == 9.0
    yaml_view = await admin.get("/admin/policy", params={"format": "yaml"})
    assert yaml_view.status_code == 200 and yaml_view.text == after
    assert yaml_view.headers["x-policy-version"] == admin.store.current.version


async def test_the_yaml_text_needs_the_admin_role(admin) -> None:
    made = await admin.post("/admin/tokens", json={"name": "ops-yaml", "role": "operator"})
    operator = {"Authorization": f"Bearer {made.json()['token']}"}
    assert (await admin.get("/admin/policy", headers=operator)).status_code == 200
    refused = await admin.get("/admin/policy", params={"format": "yaml"}, headers=operator)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "insufficient_role"
    bad = await admin.get("/admin/policy", params={"format": "toml"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "format"


async def test_with_no_policy_loaded_admin_reads_answer_503_not_500(
    tmp_path: Path, redis_url: str
) -> None:
    """A gateway whose policy file is invalid at start runs on without a policy: the admin
    endpoints that read it say so (503 policy_not_loaded) instead of failing with a 500."""
    path = tmp_path / "routing_rules.yaml"
    path.write_text("models: {broken: {provider: nowhere}}\n")
    runner = GatewayThread(make_settings(tmp_path / "gw", path, redis_url))
    gateway = runner.start()
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    body = {"body": {"messages": [{"role": "user", "content": "hi"}]}}
    try:
        async with httpx.AsyncClient(base_url=gateway.base_url, headers=headers) as client:
            answers = [
                await client.post("/admin/route/explain", json=body),
                await client.get("/admin/policy", params={"format": "yaml"}),
            ]
    finally:
        runner.stop()
    for answer in answers:
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "policy_not_loaded"
