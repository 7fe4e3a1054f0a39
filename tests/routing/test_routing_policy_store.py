"""Live policy edits: hot reload within 2 s, invalid edits change nothing, atomic writes."""

from __future__ import annotations

import asyncio
import difflib
import json
import os
import shutil
import time
from pathlib import Path

import pytest
import yaml

from gateway.policy import PolicyError
from gateway.policy.store import PolicyBody, PolicyStore, policy_body
from gateway.routing.router import Router


async def wait_for(predicate, timeout_s: float = 2.0) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def test_file_edit_applies_within_two_seconds(policy_data, policy_file) -> None:
    path = policy_file(policy_data())
    store = PolicyStore(path)
    store.load()
    router = Router(store)
    before = router.plan(body={}, headers={}, key_id="k", allowed_models=None)
    assert before.candidates[0].model == "big"
    store.start_watching()
    try:
        edited = policy_data()
        edited["tasks"]["chat"]["candidates"] = ["other", "big"]
        path.write_text(yaml.safe_dump(edited))
        took = await wait_for(lambda: store.current.version != before.policy_version)
        assert took < 2.0
        after = router.plan(body={}, headers={}, key_id="k", allowed_models=None)
        assert after.candidates[0].model == "other"
        # The request that started before the edit keeps its own snapshot.
        assert before.policy.tasks["chat"].candidates == ["big", "other"]
        assert store.last_error is None
    finally:
        await store.stop()


async def test_invalid_edit_changes_nothing_and_is_reported(policy_data, policy_file) -> None:
    path = policy_file(policy_data())
    store = PolicyStore(path, poll_interval_s=0.1)
    store.load()
    version = store.current.version
    store.start_watching()
    try:
        broken = policy_data()
        broken["models"]["big"]["price"]["output"] = -5
        path.write_text(yaml.safe_dump(broken))
        await wait_for(lambda: store.last_error is not None)
        assert store.last_error.path == "models.big.price.output"
        assert store.current.version == version
        assert store.policy.models["big"].price.output == 8.0
        described = store.describe()
        assert described["last_error"]["path"] == "models.big.price.output"
        assert described["version"] == version
        path.write_text("providers: [oops")
        await wait_for(lambda: "invalid YAML" in str(store.last_error))
        assert store.current.version == version
        fixed = policy_data()
        fixed["models"]["big"]["price"]["output"] = 9.0
        path.write_text(yaml.safe_dump(fixed))
        await wait_for(lambda: store.current.version != version)
        assert store.last_error is None and store.policy.models["big"].price.output == 9.0
    finally:
        await store.stop()


def test_touching_the_file_does_not_reload(policy_data, policy_file) -> None:
    path = policy_file(policy_data())
    store = PolicyStore(path)
    loaded = store.load()
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10_000_000))
    assert store.poll_once() is False
    assert store.current is loaded


def test_write_is_validated_then_atomic(policy_data, policy_file) -> None:
    path = policy_file(policy_data())
    store = PolicyStore(path)
    store.load()
    original = path.read_text()
    bad = policy_data(default_task="nap")
    with pytest.raises(PolicyError) as caught:
        store.write(yaml.safe_dump(bad))
    assert caught.value.path == "default_task"
    assert path.read_text() == original  # nothing written
    good_text = "# edited by the admin API\n" + yaml.safe_dump(policy_data(default_task="save"))
    loaded = store.write(good_text)
    assert path.read_text() == good_text and loaded.policy.default_task == "save"
    assert loaded.source == "admin api"
    leftovers = [p.name for p in path.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []
    assert store.poll_once() is False  # our own write is not reloaded a second time


def test_json_bodies_are_read_within_bounds(policy_data) -> None:
    data = policy_data()
    assert policy_body(json.dumps(data).encode(), "application/json") == PolicyBody(data=data)
    assert policy_body(b"models: {}\n", "application/yaml") == PolicyBody(text="models: {}\n")
    with pytest.raises(PolicyError, match="invalid JSON"):
        policy_body(b"{nope", "application/json")
    with pytest.raises(PolicyError, match="UTF-8"):
        policy_body(b"\xff\xfe", "application/yaml")
    with pytest.raises(PolicyError, match="at most 262144"):
        policy_body(b"#" * 300_000, "application/yaml")


SHIPPED_POLICY = Path(__file__).resolve().parents[2] / "routing_rules.yaml"


def test_a_json_edit_keeps_the_files_comments_and_layout(tmp_path) -> None:
    """GET's policy (every default spelled out) with one field changed, PUT back as JSON:
    the file changes on that one line; comments, key order and flow style stay."""
    path = tmp_path / "routing_rules.yaml"
    shutil.copy(SHIPPED_POLICY, path)
    before = path.read_text()
    store = PolicyStore(path)
    store.load()
    edited = store.describe()["policy"]
    assert edited["models"]["gpt-4o"]["context_window"] == 128000
    edited["models"]["gpt-4o"]["context_window"] = 64000
    loaded = store.write_body(PolicyBody(data=edited))
    after = path.read_text()
    changed = [
        line
        for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert changed == ["-    context_window: 128000", "+    context_window: 64000"], changed
    assert before.count("#") == after.count("#")  # every comment kept
    assert "formats: null" not in after and "deployments: {}" not in after
    # The written file re-parses to the edited policy, and that is what is in force.
    assert PolicyStore(path).load().policy == loaded.policy
    assert loaded.policy.model_dump(mode="json", by_alias=True) == edited


def test_a_json_edit_that_adds_and_removes_keys_changes_only_those(policy_data, tmp_path) -> None:
    path = tmp_path / "routing_rules.yaml"
    data = policy_data()
    path.write_text("# the team's policy\n" + yaml.safe_dump(data, sort_keys=False))
    store = PolicyStore(path)
    store.load()
    edited = json.loads(json.dumps(data))
    edited["default_task"] = "save"  # changed
    first_model = next(iter(edited["models"]))
    edited["models"][first_model]["context_window"] = 4096  # added
    loaded = store.write_body(PolicyBody(data=edited))
    after = path.read_text()
    assert after.startswith("# the team's policy\n")
    assert list(yaml.safe_load(after)) == list(data)  # key order kept
    assert "context_window: 4096" in after and "default_task: save" in after
    assert loaded.policy.default_task == "save"
    assert PolicyStore(path).load().policy == loaded.policy


def test_removed_file_keeps_the_policy_until_it_returns(policy_data, policy_file) -> None:
    path = policy_file(policy_data())
    store = PolicyStore(path)
    loaded = store.load()
    text = path.read_text()
    path.unlink()
    assert store.poll_once() is False
    assert "cannot stat" in str(store.last_error) and store.current is loaded
    path.write_text(text)
    assert store.poll_once() is False  # same content: nothing to apply, error cleared
    assert store.last_error is None and store.current is loaded


def test_a_hostile_file_edit_is_refused_and_the_policy_stays(policy_data, policy_file) -> None:
    """The file watcher meets the same bounds as the admin API: no RecursionError, no bomb."""
    path = policy_file(policy_data())
    store = PolicyStore(path)
    store.load()
    version = store.current.version
    laughs = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        laughs.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    for text, says in (
        ("[" * 3000 + "]" * 3000, "nested more than"),
        ("\n".join(laughs), "expands to more than"),
        ("a: &a x\nb: [" + ", ".join(["*a"] * 2000) + "]\n", "more than 1000 aliases"),
        ("a: &a x\nb: [" + ", ".join(["*a"] * 225_000) + "]\n", "at most 262144"),
    ):
        path.write_text(text)
        assert store.poll_once() is False
        assert says in str(store.last_error)
        assert store.current.version == version
