"""Context-window routing and ``fallback_on``, end to end through a real gateway and the native
upstreams: a prompt too long for a candidate's ``context_window`` skips it (recorded, shown by
explain and in the route header), and a task that opts in moves on to the next candidate on an
upstream's ``context_length_exceeded`` or ``content_filter`` error, read from each provider's
own error format. Without the opt-in, those errors are the client's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from gateway_runner import GatewayThread, RunningGateway, make_settings
from native_gateway import KEY_ENV, native_fleet, native_policy
from native_upstreams import NativeFleet

MODELS = """
  small-window:
    provider: openai
    upstream_model: gpt-4o-mini
    context_window: 50
  big-window:
    provider: anthropic
    upstream_model: claude-big
    context_window: 200000
  overflowing:
    provider: openai
    upstream_model: ctx-overflow
  overflowing-claude:
    provider: anthropic
    upstream_model: ctx-overflow
  filtered-azure:
    provider: azure
    upstream_model: filtered
"""
TASKS = """
tasks:
  long-docs:
    candidates: [small-window, big-window]
  tiny-only:
    candidates: [small-window]
  careful:
    candidates: [overflowing, overflowing-claude, gpt]
    fallback_on: [context_length_exceeded, content_filter]
  strict:
    candidates: [overflowing, gpt]
  moderated:
    candidates: [filtered-azure, claude]
    fallback_on: [content_filter]
  moderated-strict:
    candidates: [filtered-azure, claude]
"""
LONG = "word " * 400  # ~500 estimated tokens: more than small-window's 50


@pytest.fixture(scope="module")
def routed(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[tuple[RunningGateway, NativeFleet, str]]:
    root: Path = tmp_path_factory.mktemp("context")
    with pytest.MonkeyPatch.context() as env, native_fleet() as fleet:
        for name, value in KEY_ENV.items():
            env.setenv(name, value)
        policy = root / "routing_rules.yaml"
        policy.write_text(native_policy(fleet, models=MODELS, tail=TASKS))
        with GatewayThread(make_settings(root / "data", policy, redis_url)) as gateway:
            _, key = gateway.create_key(name="context")
            yield gateway, fleet, key


def _chat(gateway: RunningGateway, key: str, task: str, text: str) -> httpx.Response:
    return httpx.post(
        gateway.v1 + "/chat/completions",
        headers={"Authorization": f"Bearer {key}", "X-Task-Type": task},
        json={"messages": [{"role": "user", "content": text}]},
        timeout=30,
    )


def test_a_prompt_too_long_for_a_window_skips_that_candidate(routed) -> None:
    gateway, fleet, key = routed
    short = _chat(gateway, key, "long-docs", "hi")
    assert short.status_code == 200 and short.headers["x-switchyard-model"] == "small-window"
    long = _chat(gateway, key, "long-docs", LONG)
    assert long.status_code == 200, long.text
    assert long.headers["x-switchyard-model"] == "big-window"
    route = long.headers["x-switchyard-route"]
    assert "skipped small-window: prompt ~" in route and "exceeds context_window 50" in route
    assert fleet["anthropic"].seen[-1].body["model"] == "claude-big"
    with gateway.admin() as admin:
        explained = admin.post(
            "/admin/route/explain",
            json={"body": {"messages": [{"role": "user", "content": LONG}]},
                  "headers": {"X-Task-Type": "long-docs"}},
        ).json()  # fmt: skip
    assert explained["prompt_tokens_estimate"] > 50
    assert explained["health"][0]["verdict"].startswith("skipped: prompt ~")
    assert explained["would_serve"] == "big-window"
    events = admin_events(gateway)
    assert events[0]["attempts"] == 2  # the skip and the served try


def admin_events(gateway: RunningGateway) -> list[dict]:
    gateway.wait_exported()
    with gateway.admin() as admin:
        return admin.get("/admin/usage/events", params={"limit": 5}).json()["data"]


def test_no_window_fits_is_a_400_context_length_exceeded(routed) -> None:
    gateway, _, key = routed
    response = _chat(gateway, key, "tiny-only", LONG)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "small-window: prompt ~" in error["message"]


def test_fallback_on_moves_on_from_each_format_s_context_error(routed) -> None:
    gateway, fleet, key = routed
    fleet.reset()
    response = _chat(gateway, key, "careful", "hi")
    assert response.status_code == 200, response.text
    assert response.headers["x-switchyard-model"] == "gpt"
    # OpenAI's code and Anthropic's "prompt is too long" were both read as the same error.
    assert [seen.body["model"] for seen in fleet["openai"].seen] == ["ctx-overflow", "gpt-4o"]
    assert [seen.body["model"] for seen in fleet["anthropic"].seen] == ["ctx-overflow"]


def test_without_the_opt_in_the_context_error_is_the_client_s(routed) -> None:
    gateway, fleet, key = routed
    fleet.reset()
    response = _chat(gateway, key, "strict", "hi")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert "maximum context length" in response.json()["error"]["message"]
    assert len(fleet["openai"].seen) == 1  # no fallback tried


def test_content_filter_fallback_is_opt_in(routed) -> None:
    gateway, _, key = routed
    served = _chat(gateway, key, "moderated", "hi")
    assert served.status_code == 200 and served.headers["x-switchyard-model"] == "claude"
    refused = _chat(gateway, key, "moderated-strict", "hi")
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "content_filter"


def test_the_context_error_reaches_other_formats_in_theirs(routed) -> None:
    gateway, _, key = routed
    sdk = anthropic.Anthropic(base_url=gateway.base_url, api_key=key, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk.messages.create(
            model="overflowing", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    body = caught.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "maximum context length" in body["error"]["message"]
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="overflowing-claude", input="hi")
    assert raised.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
