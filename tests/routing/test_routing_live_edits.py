"""Live policy edits through the running gateway: hot reload under load, invalid edits, the admin
API over HTTP, and the route in the request log line."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import yaml
from polling import wait_for
from route_rig import RouteRig

WORKERS = 8
TAKES_EFFECT_S = 2.0


@dataclass(frozen=True)
class Call:
    started: float
    ended: float
    model: str | None
    error: str | None


class Load:
    """``WORKERS`` concurrent SDK clients sending chat requests back to back until stopped."""

    def __init__(self, rig: RouteRig) -> None:
        self.rig = rig
        self.calls: list[Call] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Load:
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(WORKERS)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _worker(self) -> None:
        async with self.rig.async_client() as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    raw = await client.chat.completions.with_raw_response.create(
                        model="auto",
                        messages=[{"role": "user", "content": "hi"}],
                        extra_headers={"X-Task-Type": "chat"},
                    )
                    raw.parse()
                    model, error = raw.headers.get("x-switchyard-model"), None
                except Exception as exc:  # every failure is a finding: record it, keep going
                    model, error = None, repr(exc)
                self.calls.append(Call(started, time.monotonic(), model, error))

    def first_started_after(self, moment: float, model: str) -> Call | None:
        return next(
            (c for c in self.calls if c.started >= moment and c.model == model and c.error is None),
            None,
        )

    async def wait_for_model(self, moment: float, model: str) -> Call:
        deadline = moment + TAKES_EFFECT_S + 1.0
        while time.monotonic() < deadline:
            call = self.first_started_after(moment, model)
            if call is not None:
                return call
            await asyncio.sleep(0.02)
        raise AssertionError(f"{model} never served after the edit")


def chat_order(rig: RouteRig, *candidates: str) -> dict[str, Any]:
    data = rig.policy_data()
    data["tasks"]["chat"]["candidates"] = list(candidates)
    return data


def policy_state(rig: RouteRig) -> dict[str, Any]:
    with rig.admin() as admin:
        response = admin.get("/admin/policy")
    assert response.status_code == 200, response.text
    return response.json()


async def test_hot_reload_under_load_loses_no_request(rig: RouteRig) -> None:
    orders = [("m-beta", "m-alpha"), ("m-alpha", "m-beta")] * 2
    writes: list[float] = []
    switches: list[tuple[float, str]] = []
    async with Load(rig) as load:
        await asyncio.sleep(0.3)
        for index, order in enumerate(orders):
            data = chat_order(rig, *order)
            written = time.monotonic()
            writes.append(written)
            if index % 2:
                rig.policy_path.write_text(yaml.safe_dump(data, sort_keys=False))  # in place
            else:
                rig.write_policy(data)  # temp file + rename
            call = await load.wait_for_model(written, order[0])
            assert call.ended - written <= TAKES_EFFECT_S, call.ended - written
            switches.append((call.ended, order[0]))
            await asyncio.sleep(0.3)
        ended = time.monotonic()
    failures = [c.error for c in load.calls if c.error is not None]
    assert failures == []
    assert len(load.calls) >= 50, len(load.calls)
    # Once an edit took effect, every request started afterwards (until the next edit) followed
    # it: a request reads the policy once, and the swap is atomic.
    for (since, model), until in zip(switches, [*writes[1:], ended], strict=True):
        window = [c.model for c in load.calls if since <= c.started < until]
        assert window and set(window) == {model}, (model, set(window))
    assert policy_state(rig)["last_error"] is None


async def test_invalid_edit_under_load_changes_nothing(rig: RouteRig) -> None:
    before = policy_state(rig)
    broken = rig.policy_data()
    broken["models"]["m-alpha"]["price"]["input"] = -1
    async with Load(rig) as load:
        await asyncio.sleep(0.2)
        rig.write_policy(broken)

        def rejected() -> dict[str, Any] | None:
            return policy_state(rig)["last_error"]

        error = await asyncio.to_thread(wait_for, rejected, TAKES_EFFECT_S)
        await asyncio.sleep(0.5)
    assert error["path"] == "models.m-alpha.price.input"
    assert "must not be negative" in error["message"]
    after = policy_state(rig)
    assert after["version"] == before["version"]
    assert after["policy"] == before["policy"]
    assert [c.error for c in load.calls if c.error] == []
    assert {c.model for c in load.calls} == {"m-alpha"}
    # Fixing the file clears the error.
    rig.write_policy(rig.policy_data())
    await asyncio.to_thread(wait_for, lambda: policy_state(rig)["last_error"] is None, 2.0)


def test_admin_policy_put_and_validate_over_http(rig: RouteRig) -> None:
    base = rig.gateway.base_url
    text = yaml.safe_dump(chat_order(rig, "m-beta", "m-alpha"), sort_keys=False)
    for headers in ({}, {"Authorization": f"Bearer {rig.key}"}):
        response = httpx.put(f"{base}/admin/policy", content=text, headers=headers)
        assert response.status_code in (401, 403), response.text
    before = policy_state(rig)
    with rig.admin() as admin:
        # validate: a dry run
        response = admin.post("/admin/policy/validate", content=text)
        assert response.status_code == 200 and response.json()["valid"] is True
        broken = chat_order(rig, "m-beta", "m-missing")
        response = admin.post(
            "/admin/policy/validate",
            content=orjson.dumps(broken),
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "invalid_policy"
        assert error["param"].startswith("tasks.chat.candidates")
        assert policy_state(rig)["version"] == before["version"]
        # PUT, invalid: nothing written, nothing applied
        on_disk = rig.policy_path.read_bytes()
        response = admin.put("/admin/policy", content=yaml.safe_dump(broken))
        assert response.status_code == 400
        assert response.json()["error"]["param"].startswith("tasks.chat.candidates")
        assert rig.policy_path.read_bytes() == on_disk
        assert policy_state(rig)["version"] == before["version"]
        # PUT, valid JSON: written as YAML and applied at once
        response = admin.put(
            "/admin/policy",
            content=orjson.dumps(chat_order(rig, "m-beta", "m-alpha")),
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 200 and response.json()["applied"] is True
        new_version = response.json()["version"]
    assert new_version != before["version"]
    on_disk_data = yaml.safe_load(rig.policy_path.read_text())
    assert on_disk_data["tasks"]["chat"]["candidates"] == ["m-beta", "m-alpha"]
    _, headers = rig.chat("chat")
    assert headers["x-switchyard-model"] == "m-beta"
    state = policy_state(rig)
    assert state["version"] == new_version and state["source"] == "admin api"


def test_request_log_line_carries_the_route(rig: RouteRig) -> None:
    from fake_provider import Step

    rig.chat("chat", extra_headers={"X-Request-ID": "log-route-1"})
    rig.fleet["alpha"].play(then=Step("status", 500))
    rig.chat("chat", extra_headers={"X-Request-ID": "log-route-2"})

    def lines() -> dict[str, dict[str, Any]]:
        found = {e["request_id"]: e for e in rig.log_events("request")}
        return found if {"log-route-1", "log-route-2"} <= found.keys() else {}

    found = wait_for(lines, 2.0)
    first, second = found["log-route-1"], found["log-route-2"]
    assert (first["task"], first["strategy"], first["route_reason"]) == (
        "chat",
        "ordered",
        "ordered #1",
    )
    assert (first["model"], first["provider"], first["attempts"], first["status"]) == (
        "m-alpha",
        "alpha",
        1,
        200,
    )
    # Two failed tries of m-alpha, then m-beta served as the second choice.
    assert (second["model"], second["route_reason"], second["attempts"]) == (
        "m-beta",
        "ordered #2",
        3,
    )
