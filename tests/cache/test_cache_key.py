"""The cache key: stable for the same request, different when anything that shapes the answer
differs (every body field but the documented few), and scoped per team."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from gateway.cache import (
    IGNORED_FIELDS,
    CacheScope,
    canonical_request,
    nondeterminism,
    request_key,
)
from gateway.policy import Candidate

ROUTED = Candidate("gpt-4.1", "openai", "gpt-4.1", reason="task=chat")

BODY: dict[str, Any] = {
    "model": "gpt-4.1",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "temperature": 0,
    "seed": 7,
    "max_tokens": 64,
}


def key_of(body: dict[str, Any], mode: str = "json", **routed: str) -> str:
    model = dataclasses.replace(ROUTED, **routed)
    return request_key("chat.completions", body, mode, model)  # type: ignore[arg-type]


def test_same_request_same_key_whatever_the_spelling() -> None:
    reordered = {name: BODY[name] for name in reversed(list(BODY))}
    reordered["messages"] = [dict(reversed(list(m.items()))) for m in BODY["messages"]]
    floats = {**BODY, "temperature": 0.0, "max_tokens": 64.0}
    assert key_of(BODY) == key_of(copy.deepcopy(BODY)) == key_of(reordered) == key_of(floats)
    assert len(key_of(BODY)) == 64
    # Canonical JSON: sorted keys, no whitespace.
    canonical = canonical_request("chat.completions", BODY, "json", ROUTED)
    assert b" " not in canonical.replace(b"Be brief.", b"").replace(b"What is 2+2?", b"")
    assert canonical.index(b'"body"') < canonical.index(b'"mode"') < canonical.index(b'"route"')


# Every field that can shape the answer, including one the gateway has never heard of.
CHANGES: dict[str, Any] = {
    "messages": [{"role": "user", "content": "What is 2+3?"}],
    "temperature": 0.5,
    "top_p": 0.9,
    "seed": 8,
    "max_tokens": 65,
    "max_completion_tokens": 10,
    "stop": ["\n"],
    "tools": [{"type": "function", "function": {"name": "add", "parameters": {}}}],
    "tool_choice": "required",
    "parallel_tool_calls": False,
    "response_format": {"type": "json_object"},
    "n": 2,
    "logprobs": True,
    "top_logprobs": 3,
    "frequency_penalty": 0.1,
    "presence_penalty": 0.1,
    "logit_bias": {"50256": -100},
    "reasoning_effort": "low",
    "service_tier": "flex",
    "modalities": ["text"],
    "prediction": {"type": "content", "content": "4"},
    "x_future_sampling_option": 1,
}


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_every_field_that_shapes_the_answer_changes_the_key(field: str) -> None:
    assert key_of({**BODY, field: CHANGES[field]}) != key_of(BODY)


def test_message_order_and_nested_content_matter() -> None:
    swapped = {**BODY, "messages": list(reversed(BODY["messages"]))}
    assert key_of(swapped) != key_of(BODY)
    edited = copy.deepcopy(BODY)
    edited["messages"][1]["name"] = "alice"
    assert key_of(edited) != key_of(BODY)


IGNORED_VALUES: dict[str, Any] = {
    "model": "my-alias",
    "stream": True,
    "stream_options": {"include_usage": True},
    "user": "end-user-42",
    "safety_identifier": "hash-of-user",
    "metadata": {"task_type": "chat", "trace": "abc"},
    "store": True,
    "prompt_cache_key": "tenant-a",
}


def test_the_ignored_list_is_exactly_documented() -> None:
    assert set(IGNORED_VALUES) == IGNORED_FIELDS


@pytest.mark.parametrize("field", sorted(IGNORED_VALUES))
def test_fields_that_cannot_change_the_answer_are_ignored(field: str) -> None:
    assert key_of({**BODY, field: IGNORED_VALUES[field]}) == key_of(BODY)


def test_the_routed_model_route_and_mode_are_in_the_key() -> None:
    base = key_of(BODY)
    assert key_of(BODY, model="gpt-4.1-mini") != base
    assert key_of(BODY, provider="azure") != base
    assert key_of(BODY, upstream_model="gpt-4.1-2025-04-14") != base  # a remapped model
    assert key_of(BODY, mode="sse") != base
    assert request_key("completions", BODY, "json", ROUTED) != base
    # Why and how the router chose it is not: a spilled or canary pick shares the entry.
    chosen_otherwise = dataclasses.replace(ROUTED, reason="canary", spilled=True)
    assert request_key("chat.completions", BODY, "json", chosen_otherwise) == base


def test_scopes_keep_teams_apart_unless_shared() -> None:
    a = CacheScope.of(model="m", team="alpha", key_id="k1", shared=False)
    a_other_key = CacheScope.of(model="m", team="alpha", key_id="k2", shared=False)
    b = CacheScope.of(model="m", team="beta", key_id="k1", shared=False)
    loner = CacheScope.of(model="m", team=None, key_id="k3", shared=False)
    loner2 = CacheScope.of(model="m", team="", key_id="k4", shared=False)
    shared = CacheScope.of(model="m", team="alpha", key_id="k1", shared=True)
    assert a == a_other_key and a.namespace == "team:alpha" and a.team == "alpha"
    assert len({a.id, b.id, loner.id, loner2.id, shared.id}) == 5
    assert loner.team is None and loner.namespace == "key:k3" and shared.team is None
    assert CacheScope.of(model="n", team="alpha", key_id="k1", shared=False).id != a.id
    # A team named like a namespace cannot collide with one: the scope id hashes both parts.
    assert CacheScope("team:key:k3", "m").id != loner.id
    assert CacheScope.from_member(a.member) == a


@pytest.mark.parametrize(
    ("route", "body", "deterministic"),
    [
        ("chat.completions", {"temperature": 0}, True),
        ("chat.completions", {"temperature": 0.0, "n": 1}, True),
        ("chat.completions", {"temperature": 0.7, "seed": 3}, True),
        ("chat.completions", {"seed": 0}, True),
        ("chat.completions", {}, False),  # the default temperature is 1
        ("chat.completions", {"temperature": 0.2}, False),
        ("chat.completions", {"temperature": 0, "n": 2}, False),
        ("chat.completions", {"temperature": False}, False),  # a bool is not a number
        ("chat.completions", {"seed": None, "temperature": 1}, False),
        ("completions", {"temperature": 0}, True),
        ("completions", {"temperature": 1}, False),
        ("embeddings", {}, True),
        ("images.generations", {"n": 1}, False),
    ],
)
def test_only_deterministic_requests_qualify(
    route: str, body: dict[str, Any], deterministic: bool
) -> None:
    reason = nondeterminism(route, body)
    assert (reason is None) == deterministic
    if reason is not None:
        assert reason


def test_forwarded_headers_are_part_of_the_key_and_none_keys_as_before() -> None:
    plain = request_key("chat.completions", BODY, "json", ROUTED)
    assert request_key("chat.completions", BODY, "json", ROUTED, {}) == plain
    beta = request_key("chat.completions", BODY, "json", ROUTED, {"anthropic-beta": "context-1m"})
    other = request_key("chat.completions", BODY, "json", ROUTED, {"anthropic-beta": "other"})
    assert len({plain, beta, other}) == 3
