"""The completion side of the hold: a request that sets no max_tokens is held at what any
candidate may be sent, a model's policy ``defaults.max_tokens`` included."""

from __future__ import annotations

from gateway.metering.gate import completion_default, usage_bound
from gateway.policy import Candidate, parse_policy
from gateway.routing.router import RoutePlan
from gateway.settings import LimiterSettings

POLICY = parse_policy(
    """
providers:
  p: {base_url: "http://127.0.0.1:9/v1"}
models:
  short: {provider: p}
  long: {provider: p, defaults: {max_tokens: 4000}}
"""
)


def plan_of(*models: str) -> RoutePlan:
    return RoutePlan(
        task=None,
        strategy="pinned",
        candidates=[Candidate(m, "p", m, "pinned") for m in models],
        policy_version="v",
        policy=POLICY,
    )


def test_a_models_default_max_tokens_above_the_gateways_is_what_is_held() -> None:
    settings = LimiterSettings(default_max_tokens=256)
    assert completion_default(POLICY, plan_of("short"), settings) == 256
    # The fallback may be the one that serves: its default is sent upstream, so held.
    assert completion_default(POLICY, plan_of("short", "long"), settings) == 4000
    body = {"messages": [{"role": "user", "content": "hi"}]}
    held = usage_bound(
        body, "chat.completions", completion_default(POLICY, plan_of("long"), settings)
    )
    assert held.completion_tokens == 4000
    # What the request sets wins over every default.
    capped = usage_bound({**body, "max_tokens": 7}, "chat.completions", 4000)
    assert capped.completion_tokens == 7
