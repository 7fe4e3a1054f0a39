"""Router: task choice, every strategy, constraints, fallbacks, canaries and allow-lists."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from gateway.errors import InvalidRequest, NotFound, PermissionDenied
from gateway.policy.store import PolicyStore
from gateway.routing.canary import canary_bucket, in_canary
from gateway.routing.estimate import (
    IMAGE_PART_TOKENS,
    estimate_prompt_tokens,
    expected_output_tokens,
    prompt_token_bound,
)
from gateway.routing.router import Router
from gateway.routing.state import RoutingState


@pytest.fixture
def make_router(policy_data, policy_file):
    def make(state: RoutingState | None = None, seed: int = 7, **overrides) -> Router:
        store = PolicyStore(policy_file(policy_data(**overrides)))
        store.load()
        return Router(store, state or RoutingState.build(), random.Random(seed))

    return make


def plan(router: Router, body=None, headers=None, key="key-1", allowed=None):
    return router.plan(body=body or {}, headers=headers or {}, key_id=key, allowed_models=allowed)


def models(route) -> list[str]:
    return [c.model for c in route.candidates]


def test_task_from_header_then_metadata_then_default(make_router) -> None:
    router = make_router()
    assert plan(router).task == "chat"
    assert plan(router, {"model": "auto"}).task == "chat"
    by_body = plan(router, {"metadata": {"task_type": "save"}})
    assert (by_body.task, by_body.strategy) == ("save", "cheapest")
    by_header = plan(router, {"metadata": {"task_type": "save"}}, {"X-Task-Type": "speed"})
    assert by_header.task == "speed"
    with pytest.raises(InvalidRequest) as caught:
        plan(router, {}, {"x-task-type": "dance"})
    assert caught.value.param == "x-task-type" and "dance" in caught.value.message


def test_ordered_with_task_and_model_fallbacks(make_router) -> None:
    route = plan(make_router())
    # chat: big, other; then the task fallback tiny; then big's fallback small.
    assert models(route) == ["big", "other", "tiny", "small"]
    reasons = [c.reason for c in route.candidates]
    assert reasons == ["ordered #1", "ordered #2", "task fallback", "fallback of big"]
    assert route.header_value(route.candidates[0]) == (
        "task=chat; strategy=ordered; reason=ordered #1"
    )
    assert route.header_value(route.candidates[0], spilled=True).endswith("; spilled")


def test_pinned_model_and_alias_then_fallbacks(make_router) -> None:
    router = make_router()
    route = plan(router, {"model": "best"})
    assert route.strategy == "pinned" and route.task is None
    assert models(route) == ["big", "small", "other"]  # fallbacks are transitive
    assert route.candidates[0].reason == "pinned via alias best"
    assert route.candidates[2].reason == "fallback of small"
    assert plan(router, {"model": "other"}).candidates[0].reason == "pinned"
    with pytest.raises(NotFound) as caught:
        plan(router, {"model": "gpt-99"})
    assert caught.value.code == "model_not_found"
    with pytest.raises(InvalidRequest):
        plan(router, {"model": 42})


def test_cheapest_uses_the_price_table_for_this_request(make_router) -> None:
    router = make_router()
    long_prompt = {"messages": [{"role": "user", "content": "x" * 40_000}], "max_tokens": 10}
    # 10k prompt tokens, 10 out: wordy (0.05 in) is cheapest, then small, then big.
    route = plan(router, long_prompt, {"x-task-type": "save"})
    assert models(route)[:3] == ["wordy", "small", "big"]
    assert route.candidates[0].reason.startswith("cheapest: est $0.0007")
    # A long answer flips it: wordy's output price (20/M) makes it the dearest.
    short_prompt = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000}
    assert models(plan(router, short_prompt, {"x-task-type": "save"}))[:3] == [
        "small",
        "big",
        "wordy",
    ]


def test_lowest_latency_follows_observed_latency(make_router) -> None:
    state = RoutingState.build(latency_alpha=0.5)
    router = make_router(state)
    speed = {"x-task-type": "speed"}
    assert models(plan(router, {}, speed))[:3] == ["big", "small", "other"]  # no samples
    state.latency.observe("big", 0.40)
    state.latency.observe("small", 0.10)
    state.latency.observe("other", 0.25)
    route = plan(router, {}, speed)
    assert models(route)[:3] == ["small", "other", "big"]
    assert route.candidates[0].reason == "lowest_latency: ewma 100 ms"
    for _ in range(4):  # small gets slow; the moving average catches up
        state.latency.observe("small", 0.9)
    assert models(plan(router, {}, speed))[:3] == ["other", "big", "small"]


def test_weighted_distribution_and_request_id_stickiness(make_router) -> None:
    router = make_router(seed=11)
    mix = {"x-task-type": "mix"}
    counts = Counter(models(plan(router, {}, mix))[0] for _ in range(5000))
    assert abs(counts["big"] / 5000 - 0.70) < 0.03
    assert abs(counts["small"] / 5000 - 0.20) < 0.03
    assert abs(counts["other"] / 5000 - 0.10) < 0.03
    sticky = {"x-task-type": "mix", "X-Request-ID": "req-123"}
    firsts = {models(plan(router, {}, sticky))[0] for _ in range(20)}
    assert len(firsts) == 1
    by_id = Counter(
        models(plan(router, {}, {"x-task-type": "mix", "x-request-id": f"r{i}"}))[0]
        for i in range(5000)
    )
    assert abs(by_id["big"] / 5000 - 0.70) < 0.03
    route = plan(router, {}, sticky)
    assert route.candidates[0].reason.startswith("weighted ")
    assert set(models(route)) >= {"big", "small", "other"}


def test_constraints_drop_candidates_with_reasons(make_router) -> None:
    route = plan(make_router(), {}, {"x-task-type": "code"})
    assert models(route)[0] == "small"
    skipped = {c.model: c.reason for c in route.skipped}
    assert "price $8.0/Mtok over max $5" in skipped["big"]
    assert "lacks capabilities code" in skipped["other"]
    assert "wordy" in skipped


def _with_operations(policy_data, **capabilities: list[str]):
    """The base policy with these models' capabilities replaced."""
    data = policy_data()
    for model, declared in capabilities.items():
        data["models"][model]["capabilities"] = declared
    return data["models"]


def test_a_pinned_model_that_does_not_serve_the_operation_is_refused(
    make_router, policy_data
) -> None:
    router = make_router(models=_with_operations(policy_data, big=["chat", "tools"]))
    with pytest.raises(NotFound) as caught:
        router.plan(
            body={"model": "best"}, headers={}, key_id="k", allowed_models=None,
            operation="moderation",
        )  # fmt: skip
    assert caught.value.status == 404 and caught.value.code == "model_not_supported"
    assert caught.value.param == "model"
    assert "`best` does not serve moderation (its operations: chat)" in caught.value.message
    served = router.plan(
        body={"model": "best"}, headers={}, key_id="k", allowed_models=None, operation="chat"
    )
    assert models(served) == ["big", "small", "other"]


def test_models_naming_no_operation_serve_every_one(make_router) -> None:
    # Tags only (big: code, vision) or nothing at all (other): as before operations existed.
    router = make_router()
    for model in ("big", "other"):
        route = router.plan(
            body={"model": model}, headers={}, key_id="k", allowed_models=None,
            operation="embeddings",
        )  # fmt: skip
        assert models(route)[0] == model


def test_routed_candidates_and_fallbacks_that_do_not_serve_it_are_skipped(
    make_router, policy_data
) -> None:
    router = make_router(
        models=_with_operations(policy_data, big=["chat", "code"], small=["embeddings", "code"])
    )
    route = router.plan(
        body={}, headers={"x-task-type": "save"}, key_id="k", allowed_models=None,
        operation="embeddings",
    )  # fmt: skip
    assert "big" not in models(route) and "small" in models(route)
    skipped = {c.model: c.reason for c in route.skipped}
    assert skipped["big"] == "skipped: does not serve embeddings (its operations: chat)"
    assert "big skipped: does not serve embeddings (its operations: chat)" in route.notes
    # A pinned model's fallback that does not serve it is skipped the same way.
    pinned = router.plan(
        body={"model": "big"}, headers={}, key_id="k", allowed_models=None, operation="chat"
    )
    assert models(pinned) == ["big", "other"]  # big -> small -> other, small embeds only
    assert [(c.model, c.reason) for c in pinned.skipped] == [
        ("small", "skipped: does not serve chat (its operations: embeddings)")
    ]
    # A task none of whose models serves the operation: a 400 naming the task.
    only_chat = make_router(
        models=_with_operations(
            policy_data, big=["chat"], small=["chat", "code"], other=["chat"], tiny=["chat"]
        )
    )
    with pytest.raises(InvalidRequest) as caught:
        only_chat.plan(body={}, headers={}, key_id="k", allowed_models=None, operation="images")
    assert caught.value.code == "model_not_supported" and "task `chat`" in caught.value.message


def test_allow_list_filters_and_explains(make_router) -> None:
    router = make_router()
    route = plan(router, {}, allowed=frozenset({"other", "cheap"}))
    assert models(route) == ["other", "small"]
    assert {c.model: c.reason for c in route.skipped} == {
        "big": "skipped: not allowed for this key",
        "tiny": "skipped: not allowed for this key",
    }
    assert models(plan(router, {"model": "big"}, allowed=frozenset({"b*"}))) == ["big"]
    with pytest.raises(PermissionDenied) as caught:
        plan(router, {"model": "tiny"}, allowed=frozenset({"big"}))
    assert caught.value.code == "model_not_allowed" and caught.value.status == 403
    with pytest.raises(PermissionDenied) as caught:
        plan(router, {}, {"x-task-type": "code"}, allowed=frozenset({"big"}))
    assert "task `code`" in caught.value.message


def test_canary_split_is_accurate_sticky_and_monotone(make_router) -> None:
    users = [f"user-{i}" for i in range(10_000)]
    on_canary_before: set[str] = set()
    for percent in (5, 20, 50, 100):
        on_canary = {u for u in users if in_canary(canary_bucket("big", u), percent)}
        assert abs(len(on_canary) / len(users) - percent / 100) <= 0.02, percent
        assert on_canary_before <= on_canary  # nobody moves back to the old model
        on_canary_before = on_canary
    router = make_router(canaries=[{"from": "big", "to": "other", "percent": 20}])
    served = Counter()
    for user in users[:2000]:
        route = plan(router, {"model": "big", "user": user})
        first = models(route)[0]
        served[first] += 1
        again = plan(router, {"model": "big", "user": user})
        assert models(again)[0] == first  # stable across calls
        if first == "other":
            assert models(route)[:2] == ["other", "big"]
            assert route.candidates[0].reason.startswith("canary 20% bucket ")
    assert abs(served["other"] / 2000 - 0.20) <= 0.03
    # No `user` in the body: the key id decides, stably.
    key_first = {models(plan(router, {"model": "big"}, key="key-9"))[0] for _ in range(5)}
    assert len(key_first) == 1


def test_prompt_estimate_counts_text_parts() -> None:
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a" * 400}]},
            {"role": "assistant", "content": "b" * 400},
        ]
    }
    assert 200 <= estimate_prompt_tokens(body) <= 220


def test_prompt_estimate_counts_everything_the_model_reads() -> None:
    plain = {"messages": [{"role": "user", "content": "x" * 84}]}
    assert estimate_prompt_tokens(plain) == (84 + 16) // 4
    tools = [{"type": "function", "function": {"name": "f", "description": "d" * 4000}}]
    assert estimate_prompt_tokens({**plain, "tools": tools}) > 1000
    assert estimate_prompt_tokens({**plain, "functions": [tools[0]["function"]]}) > 1000
    schema = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"d": "x" * 4000}}}
    assert estimate_prompt_tokens({**plain, "response_format": schema}) > 1000
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "a" * 4000}}
    with_calls = {"messages": [{"role": "assistant", "content": None, "tool_calls": [call]}]}
    assert estimate_prompt_tokens(with_calls) > 1000
    assert estimate_prompt_tokens({"input": [[1, 2, 3, 4]]}) == 4  # token ids: one each


def test_prompt_bound_counts_utf8_bytes_and_framing() -> None:
    def chat(content: object) -> dict:
        return {"messages": [{"role": "user", "content": content}]}

    # 64 per request + 16 per message + the bytes of "role" "user" "content" and the text.
    assert prompt_token_bound(chat("x" * 84)) == 64 + 16 + 15 + 84
    # A character of CJK is 3 UTF-8 bytes (about one token): the bound covers it, the typical
    # four-characters-a-token estimate does not.
    cjk = chat("漢" * 4000)
    assert prompt_token_bound(cjk) == 64 + 16 + 15 + 12_000
    assert estimate_prompt_tokens(cjk) < 4000 < prompt_token_bound(cjk)
    assert prompt_token_bound(chat("é" * 10)) == 64 + 16 + 15 + 20
    # Token ids count one each; a batch of id lists too.
    assert prompt_token_bound({"input": [[1, 2, 3, 4], [5]]}) == 64 + 5
    assert prompt_token_bound({"prompt": [70000, 1, 2]}) == 64 + 3
    # An image part counts its allowance, not its base64 payload; its text still counts.
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 90_000}}
    parts = chat([{"type": "text", "text": "describe"}, image])
    assert prompt_token_bound(parts) == 64 + 16 + 15 + (4 + 4 + 4 + 8) + IMAGE_PART_TOKENS
    # Tools add their framing and their JSON; system blocks and Responses items are framed.
    tools = [{"type": "function", "function": {"name": "f", "description": "d" * 4000}}]
    assert prompt_token_bound({**chat("hi"), "tools": tools}) > 4000 + 512
    assert prompt_token_bound({"input": [{"role": "user", "content": "hi"}]}) == 64 + 16 + 15 + 2
    # Every field of a message counts, tool calls included.
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "漢" * 100}}
    assert prompt_token_bound({"messages": [{"role": "assistant", "tool_calls": [call]}]}) > 300


def test_completion_estimate_counts_every_choice() -> None:
    assert expected_output_tokens({}, 256) == 256
    assert expected_output_tokens({"max_tokens": 500, "n": 128}, 256) == 64_000
    assert expected_output_tokens({"max_completion_tokens": 7, "max_tokens": 500}, 256) == 7
    assert expected_output_tokens({"max_tokens": 10, "n": 2, "best_of": 5}, 256) == 50
    assert expected_output_tokens({"max_tokens": 10, "n": True, "best_of": "9"}, 256) == 10


def test_pinned_model_not_allowed_is_refused_even_with_allowed_fallbacks(make_router) -> None:
    router = make_router(canaries=[{"from": "big", "to": "other", "percent": 100}])
    with pytest.raises(PermissionDenied):
        plan(router, {"model": "big"}, allowed=frozenset({"other", "small"}))
    # The canary target is not allowed for this key: the user stays on the pinned model.
    route = plan(router, {"model": "big", "user": "u"}, allowed=frozenset({"big", "small"}))
    assert models(route) == ["big", "small"]
    assert {c.model for c in route.skipped} == {"other"}
