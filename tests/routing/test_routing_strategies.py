"""Each strategy picks what it should, seen in the response headers, and explain agrees.

The route explanation (``POST /admin/route/explain``) is asked about the same body and headers
as each real request: its first candidate that could serve must be the model that served.
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from typing import Any

import yaml
from fake_provider import Step
from route_rig import RouteRig


def explain(rig: RouteRig, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    with rig.admin() as admin:
        response = admin.post("/admin/route/explain", json={"body": body, "headers": headers})
    assert response.status_code == 200, response.text
    return response.json()


def served(rig: RouteRig, body: dict[str, Any], headers: dict[str, str]) -> dict[str, str]:
    """Send ``body`` with ``headers`` through the SDK; return the x-switchyard-* headers."""
    _, response_headers = rig.chat(extra_headers=dict(headers), **body)
    return {k: v for k, v in response_headers.items() if k.startswith("x-switchyard-")}


def first_servable(explained: dict[str, Any]) -> str:
    first = next(row["model"] for row in explained["health"] if row["verdict"].startswith("would"))
    assert explained["would_serve"] == first
    return first


def expected_cost(price: dict[str, float], prompt_tokens: int, output_tokens: int) -> Decimal:
    """Exact USD from the price list (per 1M tokens)."""
    per_mtok = {k: Decimal(str(v)) for k, v in price.items()}
    total = prompt_tokens * per_mtok.get("input", 0) + output_tokens * per_mtok.get("output", 0)
    return total / 1_000_000


def test_ordered_and_pinned_match_explain(rig: RouteRig) -> None:
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"X-Task-Type": "chat"}
    explained = explain(rig, body, headers)
    assert [c["model"] for c in explained["candidates"]] == ["m-alpha", "m-beta"]
    got = served(rig, body, headers)
    assert got["x-switchyard-model"] == "m-alpha" == first_servable(explained)
    assert got["x-switchyard-route"] == explained["header"]
    pinned = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}]}
    explained = explain(rig, pinned, {})
    assert [(c["model"], c["reason"]) for c in explained["candidates"]] == [
        ("m-alpha", "pinned via alias alpha"),
        ("m-beta", "fallback of m-alpha"),
    ]
    got = served(rig, pinned, {})
    assert got["x-switchyard-route"] == "task=-; strategy=pinned; reason=pinned via alias alpha"


def test_explain_agrees_when_candidates_fail(rig: RouteRig) -> None:
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"X-Task-Type": "chat"}
    rig.fleet["alpha"].play(then=Step("status", 500))
    for _ in range(2):  # 4 failures: the breaker (3 in a row) opens
        got = served(rig, body, headers)
        assert got["x-switchyard-model"] == "m-beta"
    explained = explain(rig, body, headers)
    assert [c["model"] for c in explained["candidates"]] == ["m-alpha", "m-beta"]
    verdicts = {row["model"]: row["verdict"] for row in explained["health"]}
    assert verdicts == {"m-alpha": "skipped: breaker open", "m-beta": "would try"}
    got = served(rig, body, headers)
    assert got["x-switchyard-model"] == first_servable(explained) == "m-beta"
    assert got["x-switchyard-route"] == explained["header"]
    assert explained["header"] == "task=chat; strategy=ordered; reason=ordered #2"


def test_cheapest_follows_the_price_table_and_the_request(rig: RouteRig) -> None:
    prices = {name: m["price"] for name, m in rig.policy_data()["models"].items() if "price" in m}
    headers = {"X-Task-Type": "save"}
    short = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 500}
    long = {"messages": [{"role": "user", "content": "x" * 4000}], "max_tokens": 1}
    for body, prompt_tokens, output_tokens in ((short, 4, 500), (long, 1004, 1)):
        costs = {
            name: expected_cost(prices[name], prompt_tokens, output_tokens)
            for name in ("m-alpha", "m-beta", "m-gamma")
        }
        cheapest = min(costs, key=costs.__getitem__)
        explained = explain(rig, {"model": "auto", **body}, headers)
        assert [c["model"] for c in explained["candidates"]] == sorted(costs, key=costs.get)
        got = served(rig, body, headers)
        assert got["x-switchyard-model"] == cheapest
        assert got["x-switchyard-route"] == (
            f"task=save; strategy=cheapest; reason=cheapest: est ${costs[cheapest].normalize():f}"
        )
    assert served(rig, short, headers)["x-switchyard-model"] == "m-alpha"
    assert served(rig, long, headers)["x-switchyard-model"] == "m-gamma"
    # A price edit changes the choice: m-gamma is no longer cheap to read.
    data = rig.policy_data()
    data["models"]["m-gamma"]["price"]["input"] = 5.0
    with rig.admin() as admin:
        response = admin.put("/admin/policy", content=yaml.safe_dump(data, sort_keys=False))
    assert response.status_code == 200, response.text
    assert served(rig, long, headers)["x-switchyard-model"] == "m-alpha"


def test_lowest_latency_follows_the_observed_latency(rig: RouteRig) -> None:
    alpha, beta = rig.fleet["alpha"], rig.fleet["beta"]
    headers = {"X-Task-Type": "speed"}
    body = {"messages": [{"role": "user", "content": "hi"}]}
    alpha.play(then=Step("slow", 0.15))
    # Neither is measured yet: each goes first once, in listed order, to get a sample.
    first = served(rig, body, headers)
    assert first["x-switchyard-route"].endswith("reason=lowest_latency: no samples yet")
    assert first["x-switchyard-model"] == "m-alpha"
    assert served(rig, body, headers)["x-switchyard-model"] == "m-beta"
    picks = Counter(served(rig, body, headers)["x-switchyard-model"] for _ in range(6))
    assert picks == {"m-beta": 6}
    # Now beta turns slow and alpha fast: traffic moves once beta's average passes alpha's.
    alpha.play()
    beta.play(then=Step("slow", 0.3))
    moved_after = None
    for index in range(8):
        got = served(rig, body, headers)
        if got["x-switchyard-model"] == "m-alpha":
            moved_after = index
            break
    assert moved_after is not None and moved_after <= 4, moved_after
    ewma_ms = int(got["x-switchyard-route"].rsplit("ewma ", 1)[1].split(" ms")[0])
    assert 100 <= ewma_ms <= 400  # alpha's one slow (0.15 s) sample, the best on record
    assert [served(rig, body, headers)["x-switchyard-model"] for _ in range(3)] == ["m-alpha"] * 3
    latency = rig.metric("switchyard_route_latency_ewma_seconds", model="m-beta")
    assert latency is not None and latency > 0.15


def test_weighted_is_deterministic_per_request_id_and_follows_weights(rig: RouteRig) -> None:
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
    picks: Counter[str] = Counter()
    for index in range(60):
        headers = {"X-Task-Type": "mix", "X-Request-ID": f"weighted-{index}"}
        explained = explain(rig, body, headers)
        got = served(rig, body, headers)
        assert got["x-switchyard-model"] == explained["candidates"][0]["model"]
        assert got["x-switchyard-route"] == explained["header"]
        picks[got["x-switchyard-model"]] += 1
    # Weights 60/30/10 over 60 fixed ids.
    assert picks["m-alpha"] > picks["m-beta"] > picks["m-gamma"] > 0, picks
    assert 25 <= picks["m-alpha"] <= 47, picks


def test_canary_split_is_sticky_per_user(rig: RouteRig) -> None:
    headers = {"X-Task-Type": "rollout"}
    by_user: dict[str, set[str]] = {}
    for round_ in range(2):
        for index in range(40):
            user = f"user-{index}"
            body = {"messages": [{"role": "user", "content": f"round {round_}"}], "user": user}
            got = served(rig, body, headers)
            by_user.setdefault(user, set()).add(got["x-switchyard-model"])
            assert "canary 30% bucket" in got["x-switchyard-route"]
            if round_ == 0 and index < 5:
                explained = explain(rig, {"model": "auto", **body}, headers)
                assert explained["candidates"][0]["model"] == got["x-switchyard-model"]
    assert all(len(models) == 1 for models in by_user.values()), by_user
    canary_users = sum(1 for models in by_user.values() if models == {"m-canary"})
    assert 4 <= canary_users <= 20, canary_users
    # The canary build is what the canary users reached upstream.
    assert sum(1 for hit in rig.fleet["beta"].hits if hit.model == "canary-build") == (
        2 * canary_users
    )
