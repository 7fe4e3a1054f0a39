"""Each door asks the model for one operation (policy/operations.py): a model whose
capabilities name other operations is refused by the gateway, in the door's own error
envelope (404 ``model_not_supported``, ``param: model``), and nothing reaches the provider.

The clients are the official SDKs; the upstreams are the native loopback ones, which keep
every request they receive (``seen``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from gateway_runner import GatewayThread, make_settings
from native_gateway import KEY_ENV, NativeGateway, native_fleet, native_policy

MODELS = """
  chat-only:
    provider: openai
    upstream_model: gpt-4o
    capabilities: [chat, tools]
  embed-only:
    provider: anthropic
    upstream_model: claude-sonnet-4
    capabilities: [embeddings]
"""
FILE = ("a.wav", b"RIFF" + bytes(64), "audio/wav")


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[NativeGateway]:
    root: Path = tmp_path_factory.mktemp("operations")
    with pytest.MonkeyPatch.context() as env, native_fleet() as fleet:
        for name, value in KEY_ENV.items():
            env.setenv(name, value)
        policy = root / "routing_rules.yaml"
        policy.write_text(native_policy(fleet, models=MODELS))
        with GatewayThread(make_settings(root / "data", policy, redis_url)) as gateway:
            key_id, key = gateway.create_key(name="operations")
            yield NativeGateway(gateway, fleet, key_id, key)


def _upstream_calls(native: NativeGateway) -> int:
    return sum(len(native.fleet[name].seen) for name in ("openai", "azure", "anthropic"))


# Every OpenAI door that is not chat, called with the chat-only model, and what it asks.
OPENAI_DOORS: dict[str, tuple[str, Callable[[openai.OpenAI], Any]]] = {
    "/v1/completions": (
        "completions",
        lambda c: c.completions.create(model="chat-only", prompt="hi", max_tokens=3),
    ),
    "/v1/embeddings": ("embeddings", lambda c: c.embeddings.create(model="chat-only", input="hi")),
    "/v1/moderations": (
        "moderation",
        lambda c: c.moderations.create(model="chat-only", input="hi"),
    ),
    "/v1/images/generations": (
        "images",
        lambda c: c.images.generate(model="chat-only", prompt="a cat"),
    ),
    "/v1/images/edits": (
        "images",
        lambda c: c.images.edit(model="chat-only", image=FILE, prompt="a hat"),
    ),
    "/v1/audio/speech": (
        "speech",
        lambda c: c.audio.speech.create(model="chat-only", voice="alloy", input="hi"),
    ),
    "/v1/audio/transcriptions": (
        "transcription",
        lambda c: c.audio.transcriptions.create(model="chat-only", file=FILE),
    ),
    "/v1/audio/translations": (
        "transcription",
        lambda c: c.audio.translations.create(model="chat-only", file=FILE),
    ),
}


@pytest.mark.parametrize("door", sorted(OPENAI_DOORS))
def test_a_chat_model_is_refused_at_every_other_openai_door(
    native: NativeGateway, door: str
) -> None:
    operation, call = OPENAI_DOORS[door]
    before = _upstream_calls(native)
    client = openai.OpenAI(base_url=native.gateway.v1, api_key=native.key, max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        call(client)
    error = caught.value.response.json()["error"]
    assert error["code"] == "model_not_supported" and error["param"] == "model"
    assert error["type"] == "invalid_request_error"
    assert f"does not serve {operation} (its operations: chat)" in error["message"]
    assert _upstream_calls(native) == before


def test_an_embeddings_model_is_refused_at_the_chat_doors(native: NativeGateway) -> None:
    before = _upstream_calls(native)
    client = openai.OpenAI(base_url=native.gateway.v1, api_key=native.key, max_retries=0)
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError) as chat:
        client.chat.completions.create(model="embed-only", messages=hi)
    with pytest.raises(openai.NotFoundError) as responses:
        client.responses.create(model="embed-only", input="hi")
    for caught in (chat, responses):
        error = caught.value.response.json()["error"]
        assert error["code"] == "model_not_supported" and error["param"] == "model"
        assert "does not serve chat (its operations: embeddings)" in error["message"]
    sdk = anthropic.Anthropic(base_url=native.gateway.base_url, api_key=native.key, max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as messages:
        sdk.messages.create(model="embed-only", max_tokens=8, messages=hi)
    with pytest.raises(anthropic.NotFoundError) as counted:
        sdk.messages.count_tokens(model="embed-only", messages=hi)
    for caught in (messages, counted):
        body = caught.value.response.json()
        assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
        assert "does not serve chat (its operations: embeddings)" in body["error"]["message"]
    assert _upstream_calls(native) == before


def test_a_model_naming_its_operation_is_served_there(native: NativeGateway) -> None:
    client = openai.OpenAI(base_url=native.gateway.v1, api_key=native.key, max_retries=0)
    reply = client.chat.completions.create(
        model="chat-only", messages=[{"role": "user", "content": "hi"}], max_tokens=8
    )
    assert reply.choices[0].message.content == "openai says: hi"
    # A model that names no operation (gpt) still serves every one, as before.
    assert client.moderations.create(model="gpt", input="hi").results
    with native.gateway.admin() as admin:
        explained = admin.post(
            "/admin/route/explain",
            json={"body": {"model": "chat-only"}, "operation": "moderation"},
        )
        unknown = admin.post(
            "/admin/route/explain", json={"body": {"model": "gpt"}, "operation": "dance"}
        )
    assert explained.status_code == 404
    assert explained.json()["error"]["code"] == "model_not_supported"
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "operation"
