"""A model's sampling ``defaults:`` in the policy reach its provider where the request sets
none, in the provider's own format (translated or not); what the request sets wins. Official
SDKs as clients, the native loopback upstreams as providers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from gateway_runner import GatewayThread, make_settings
from native_gateway import KEY_ENV, NativeGateway, native_fleet, native_policy

TUNED = """
  gpt-tuned:
    provider: openai
    upstream_model: gpt-4o
    defaults: {temperature: 0.3, top_p: 0.8, max_tokens: 77}
  gpt-chat-tuned:
    provider: openai-chat-only
    upstream_model: gpt-4o-mini
    defaults: {temperature: 0.3, max_tokens: 77}
  claude-tuned:
    provider: anthropic
    upstream_model: claude-sonnet-4
    defaults: {temperature: 0.4, max_tokens: 55}
  embed-tuned:
    provider: openai
    upstream_model: text-embedding-3-small
    defaults: {temperature: 0.3}
"""
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[NativeGateway]:
    root: Path = tmp_path_factory.mktemp("defaults")
    with pytest.MonkeyPatch.context() as env, native_fleet() as fleet:
        for name, value in KEY_ENV.items():
            env.setenv(name, value)
        policy = root / "routing_rules.yaml"
        policy.write_text(native_policy(fleet, models=TUNED))
        with GatewayThread(make_settings(root / "data", policy, redis_url)) as gateway:
            key_id, key = gateway.create_key(name="defaults")
            yield NativeGateway(gateway, fleet, key_id, key)


@pytest.fixture
def oai(native: NativeGateway) -> openai.OpenAI:
    native.fleet.reset()
    return openai.OpenAI(base_url=native.gateway.v1, api_key=native.key, max_retries=0)


@pytest.fixture
def claude(native: NativeGateway) -> anthropic.Anthropic:
    native.fleet.reset()
    return anthropic.Anthropic(base_url=native.gateway.base_url, api_key=native.key, max_retries=0)


def sent(native: NativeGateway, upstream: str) -> dict[str, Any]:
    """The body the gateway sent ``upstream`` last."""
    seen = native.fleet[upstream].seen
    assert seen, f"nothing reached {upstream}"
    body = seen[-1].body
    assert isinstance(body, dict)
    return body


def test_chat_without_sampling_gets_the_models_defaults(oai, native) -> None:
    oai.chat.completions.create(model="gpt-tuned", messages=HI)
    body = sent(native, "openai")
    assert (body["temperature"], body["top_p"], body["max_completion_tokens"]) == (0.3, 0.8, 77)


def test_what_the_request_sets_wins(oai, native) -> None:
    oai.chat.completions.create(
        model="gpt-tuned", messages=HI, temperature=1.0, max_completion_tokens=5
    )
    body = sent(native, "openai")
    assert body["temperature"] == 1.0
    assert body["max_completion_tokens"] == 5 and "max_tokens" not in body
    assert body["top_p"] == 0.8  # the one the request left out


def test_streams_get_them_too(oai, native) -> None:
    stream = oai.chat.completions.create(model="gpt-tuned", messages=HI, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert sent(native, "openai")["max_completion_tokens"] == 77


def test_translated_to_anthropic_the_model_default_beats_the_providers(oai, native) -> None:
    oai.chat.completions.create(model="claude-tuned", messages=HI)
    body = sent(native, "anthropic")
    # not the anthropic provider's default_max_tokens (4096)
    assert (body["max_tokens"], body["temperature"]) == (55, 0.4)
    assert "top_p" not in body


def test_anthropic_client_keeps_its_max_tokens(claude, native) -> None:
    claude.messages.create(model="gpt-tuned", max_tokens=20, messages=HI)
    body = sent(native, "openai")
    assert (body["max_completion_tokens"], body["temperature"], body["top_p"]) == (20, 0.3, 0.8)


def test_responses_api_in_its_own_names_and_translated(oai, native) -> None:
    oai.responses.create(model="gpt-tuned", input="Hi")
    native_body = sent(native, "openai")
    assert native_body["max_output_tokens"] == 77 and native_body["temperature"] == 0.3
    assert "max_tokens" not in native_body
    native.fleet.reset()
    oai.responses.create(model="gpt-chat-tuned", input="Hi", temperature=0.9)
    chat_body = sent(native, "openai")  # the chat-only provider: translated to chat
    assert (chat_body["max_completion_tokens"], chat_body["temperature"]) == (77, 0.9)


def test_operations_that_do_not_sample_are_left_alone(oai, native) -> None:
    oai.embeddings.create(model="embed-tuned", input="hello")
    assert "temperature" not in sent(native, "openai")
