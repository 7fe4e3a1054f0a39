"""An engine fleet behind a real gateway, called with the openai SDK: a replica killed mid-run
is ejected and its requests that had streamed nothing yet are served by another; the replica
comes back and is used again; vLLM-style metrics (queue, KV cache use) move requests off a busy
replica, and a fleet that is all busy spills to the next candidate; the route header, the admin
explain and the gateway's metrics name the replica and why."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fake_upstream import FakeUpstream
from fleet_replica import FakeReplica, ReplicaProcess
from gateway_runner import GatewayThread, RunningGateway, make_settings
from loopback import BackgroundLoop
from ports import free_port

POLICY = """
providers:
  engines:
    kind: engine_fleet
    timeout_s: 30
    connect_timeout_s: 1
    fleet:
      replicas: [{a}, {b}]
      scrape: {{interval_ms: 40, timeout_s: 0.5, model_name: tiny}}
      eject_after: 2
      probe_backoff_s: 0.3
      probe_backoff_max_s: 1
    spill_when: {{kv_usage: 0.9}}
  up:
    base_url: {upstream}
models:
  tiny:
    provider: engines
  up-model:
    provider: up
fallbacks:
  tiny: [up-model]
"""


def gateway_on(root: Path, redis_url: str, policy: str) -> GatewayThread:
    (root / "routing_rules.yaml").write_text(policy)
    settings = make_settings(
        root / "data", root / "routing_rules.yaml", redis_url, upstream_read_timeout_s=30.0
    )
    return GatewayThread(settings)


def explain(gateway: RunningGateway, body: dict[str, Any]) -> dict[str, Any]:
    with gateway.admin() as admin:
        response = admin.post("/admin/route/explain", json={"body": body})
    assert response.status_code == 200, response.text
    return response.json()


def fleet_view(gateway: RunningGateway) -> dict[str, Any]:
    return explain(gateway, chat(0))["fleets"]["engines"]


def replica_state(gateway: RunningGateway, label: str) -> str:
    for replica in fleet_view(gateway)["replicas"]:
        if replica["url"].endswith("//" + label):
            return replica["state"]
    raise AssertionError(f"{label} is not in the fleet")


def chat(n: int) -> dict[str, Any]:
    system = f"You are persona {n}. " + "Answer in the voice of this persona. " * 8
    return {
        "model": "tiny",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}],
    }


def homed_on(gateway: RunningGateway, label: str, start: int) -> dict[str, Any]:
    """A chat body whose pick, now, is ``label`` by affinity."""
    for n in range(start, start + 200):
        body = chat(n)
        pick = explain(gateway, body)["fleets"]["engines"]["pick"]
        if pick["replica"] == label and pick["reason"] == "affinity":
            return body
    raise AssertionError(f"no prefix homed on {label}")


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        time.sleep(0.02)


def served(client: openai.OpenAI, body: dict[str, Any], stream: bool) -> tuple[str, str]:
    """(the answer's text, x-switchyard-route)."""
    create = client.chat.completions.with_raw_response.create
    if not stream:
        raw = create(**body)
        text = raw.parse().choices[0].message.content or ""
        return text, raw.headers["x-switchyard-route"]
    raw = create(**body, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
    return text, raw.headers["x-switchyard-route"]


def metric(text: str, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.match(rf"{re.escape(name)}\{{(.*)\}} (\S+)$", line)
        if match and ",".join(sorted(match.group(1).split(","))) == wanted:
            return float(match.group(2))
    return None


def metrics_of(gateway: RunningGateway) -> str:
    return httpx.get(gateway.base_url + "/metrics", timeout=10).text


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    from fake_upstream import ThreadedFakeUpstream

    with ThreadedFakeUpstream() as fake:
        yield fake


def test_a_killed_replica_is_ejected_its_waiting_requests_fail_over_and_it_comes_back(
    tmp_path: Path, redis_url: str, upstream: FakeUpstream
) -> None:
    a = ReplicaProcess(free_port(), "a", tmp_path).start()
    b = ReplicaProcess(free_port(), "b", tmp_path).start()
    policy = POLICY.format(a=a.url, b=b.url, upstream=upstream.base_url)
    runner = gateway_on(tmp_path, redis_url, policy)
    try:
        gateway = runner.start()
        client = openai.OpenAI(api_key=gateway.create_key()[1], base_url=gateway.v1, max_retries=0)
        body = homed_on(gateway, a.label, 0)
        a.set(hold_s=30)  # requests reach a, and wait there for their first byte
        with ThreadPoolExecutor(2) as pool:  # two: bounded load keeps both on a (capacity 2)
            calls = [pool.submit(served, client, body, stream) for stream in (True, False)]
            wait_for(lambda: a.stats()["inflight"] == 2)
            a.kill()
            answers = [call.result(timeout=30) for call in calls]
        for text, route in answers:
            assert text == "served by b"
            assert route.endswith(f"; replica={b.label} (failover)"), route
        assert replica_state(gateway, a.label) == "ejected"
        page = metrics_of(gateway)
        assert metric(page, "switchyard_fleet_replica_up", provider="engines", replica=a.label) == 0
        picks = {"provider": "engines", "replica": b.label, "reason": "failover"}
        assert metric(page, "switchyard_fleet_picks_total", **picks) == 2

        a.start()  # back on its address: probed, readmitted, picked again
        wait_for(lambda: replica_state(gateway, a.label) == "healthy")
        text, route = served(client, homed_on(gateway, a.label, 100), stream=True)
        assert (text, route.rsplit("; ", 1)[1]) == ("served by a", f"replica={a.label} (affinity)")
    finally:
        runner.stop()
        a.kill()
        b.kill()


def test_vllm_style_metrics_drive_the_pick_and_a_busy_fleet_spills(
    tmp_path: Path, redis_url: str, upstream: FakeUpstream
) -> None:
    with BackgroundLoop() as loop:
        a = loop.run(FakeReplica(name="a").start())
        b = loop.run(FakeReplica(name="b").start())
        policy = POLICY.format(a=a.url, b=b.url, upstream=upstream.base_url)
        runner = gateway_on(tmp_path, redis_url, policy)
        try:
            gateway = runner.start()
            client = openai.OpenAI(
                api_key=gateway.create_key()[1], base_url=gateway.v1, max_retries=0
            )

            def view(label: str) -> dict[str, Any]:
                replicas = fleet_view(gateway)["replicas"]
                return next(r for r in replicas if r["url"].endswith("//" + label))

            body = homed_on(gateway, a.label, 0)
            plan = explain(gateway, body)
            pick = plan["fleets"]["engines"]["pick"]
            assert pick["routing"] == "affinity" and pick["candidates"][-1]["verdict"] == "chosen"
            assert plan["header"].endswith(f"; replica={a.label} (affinity)")
            assert explain(gateway, body) == plan  # an explain commits nothing
            text, route = served(client, body, stream=False)
            assert text == "served by a"
            assert route == f"task=-; strategy=pinned; reason=pinned; replica={a.label} (affinity)"

            a.waiting = 40  # a deep queue on a: bounded load sends its prefixes on
            wait_for(lambda: view(a.label)["waiting"] == 40)
            pick = explain(gateway, body)["fleets"]["engines"]["pick"]
            assert (pick["replica"], pick["reason"]) == (b.label, "load")
            assert pick["candidates"][0] == {
                "replica": a.label,
                "load": 40,
                "verdict": "full",
                "detail": "load 40 >= capacity 26",
            }
            assert served(client, body, stream=True) == (
                "served by b",
                f"task=-; strategy=pinned; reason=pinned; replica={b.label} (load)",
            )

            a.waiting, a.kv_usage = 0, 0.95  # past spill_when's KV use
            wait_for(lambda: (view(a.label)["waiting"], view(a.label)["kv_usage"]) == (0, 0.95))
            body = next(  # a new prefix whose home is a
                chat(n)
                for n in range(300, 500)
                if explain(gateway, chat(n))["fleets"]["engines"]["pick"]["reason"] == "spill"
            )
            pick = explain(gateway, body)["fleets"]["engines"]["pick"]
            assert pick["candidates"][0]["detail"] == "kv usage 0.95 > 0.9"
            assert served(client, body, stream=False)[1].endswith(f"replica={b.label} (spill)")

            b.kv_usage = 0.95  # every replica past spill_when: the fleet spills to the fallback
            wait_for(lambda: view(b.label)["kv_usage"] == 0.95)
            raw = client.chat.completions.with_raw_response.create(**body)
            assert raw.headers["x-switchyard-model"] == "up-model"
            assert raw.headers["x-switchyard-route"].endswith("; spilled")

            page = metrics_of(gateway)
            for replica, reason in ((a.label, "affinity"), (b.label, "load"), (b.label, "spill")):
                picks = {"provider": "engines", "replica": replica, "reason": reason}
                assert (metric(page, "switchyard_fleet_picks_total", **picks) or 0) >= 1, picks
            labels = {"provider": "engines", "replica": b.label}
            assert metric(page, "switchyard_fleet_replica_kv_usage", **labels) == 0.95
            assert metric(page, "switchyard_fleet_replica_up", **labels) == 1
        finally:
            runner.stop()
            loop.run(a.stop())
            loop.run(b.stop())
