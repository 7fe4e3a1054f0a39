"""``/v1/messages`` with the official anthropic SDK (sync, async, streaming, tools, system,
images), through a real gateway, to a native Anthropic upstream (untouched) and to OpenAI and
Azure upstreams (translated); every error in Anthropic's envelope with its status."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from gateway_runner import GatewayProcess
from native_gateway import KEY_ENV, NativeGateway, native_policy

PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d4944415478da63f8cfc0f01f0005000201a1e2c0a40000000049454e44ae426082"
    )
).decode()
TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
MODELS = ("claude", "gpt", "azure-gpt", "fleet-llama")


def client(native: NativeGateway, **options: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=native.gateway.base_url, api_key=native.key, max_retries=0, **options
    )


def test_system_and_image_reach_each_upstream_in_its_own_format(native: NativeGateway) -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                },
                {"type": "text", "text": "what is this?"},
            ],
        }
    ]
    for model in MODELS:
        reply = client(native).messages.create(
            model=model, max_tokens=50, system="Be brief.", messages=messages
        )
        assert reply.type == "message" and reply.role == "assistant"
        assert reply.content[0].text.endswith("says: what is this?")
        assert reply.stop_reason == "end_turn"
    native_body = native.fleet["anthropic"].seen[-1].body
    assert native_body["system"] == "Be brief."
    assert native_body["messages"] == messages  # untouched
    assert native_body["model"] == "claude-sonnet-4"
    translated = native.fleet["openai"].seen[-1].body
    assert translated["messages"][0] == {"role": "system", "content": "Be brief."}
    image = translated["messages"][1]["content"][0]
    assert image["type"] == "image_url"
    assert image["image_url"]["url"] == f"data:image/png;base64,{PNG}"
    assert translated["max_completion_tokens"] == 50


@pytest.mark.parametrize("model", MODELS)
def test_tool_use_and_tool_result_round_trip(native: NativeGateway, model: str) -> None:
    sdk = client(native)
    question = {"role": "user", "content": "Weather in Paris?"}
    first = sdk.messages.create(model=model, max_tokens=100, tools=TOOLS, messages=[question])
    assert first.stop_reason == "tool_use"
    call = first.content[-1]
    assert call.type == "tool_use" and call.name == "get_weather"
    assert call.input == {"city": "Paris"}
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "18 C and sunny"}
    second = sdk.messages.create(
        model=model,
        max_tokens=100,
        tools=TOOLS,
        messages=[
            question,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result]},
        ],
    )
    assert second.content[0].text.endswith("read the tool result: 18 C and sunny")
    with sdk.messages.stream(
        model=model, max_tokens=100, tools=TOOLS, messages=[question]
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert final.content[-1].input == {"city": "Paris"}


def test_async_client_and_its_streams(native: NativeGateway) -> None:
    async def run() -> list[str]:
        sdk = anthropic.AsyncAnthropic(
            base_url=native.gateway.base_url, api_key=native.key, max_retries=0
        )
        texts = []
        for model in MODELS:
            reply = await sdk.messages.create(
                model=model, max_tokens=20, messages=[{"role": "user", "content": "hi"}]
            )
            texts.append(reply.content[0].text)
            kinds = []
            async with sdk.messages.stream(
                model=model, max_tokens=20, messages=[{"role": "user", "content": "hi"}]
            ) as stream:
                async for event in stream:
                    kinds.append(event.type)
                texts.append(await stream.get_final_text())
            assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
            assert "content_block_delta" in kinds
            async with sdk.messages.stream(
                model=model,
                max_tokens=100,
                tools=TOOLS,
                messages=[{"role": "user", "content": "Weather in Paris?"}],
            ) as stream:
                final = await stream.get_final_message()
            assert final.stop_reason == "tool_use", model
            assert final.content[-1].input == {"city": "Paris"}
        await sdk.close()
        return texts

    texts = asyncio.run(run())
    assert texts == [
        "anthropic says: hi",
        "anthropic says: hi",
        "openai says: hi",
        "openai says: hi",
        "azure says: hi",
        "azure says: hi",
        "engine says: hi",
        "engine says: hi",
    ]


def test_sse_event_names_match_their_types(native: NativeGateway) -> None:
    for model in ("claude", "gpt"):
        with httpx.stream(
            "POST",
            native.gateway.v1 + "/messages",
            headers={"x-api-key": native.key, "anthropic-version": "2023-06-01"},
            json={
                "model": model,
                "max_tokens": 20,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            },
        ) as response:
            assert response.status_code == 200
            text = response.read().decode()
        events = [block for block in text.split("\n\n") if block.strip()]
        for block in events:
            name, data = block.split("\n", 1)
            assert data.startswith("data: ")
            assert name.removeprefix("event: ") in data
        assert events[-1].startswith("event: message_stop")


def _error(exc: anthropic.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return body["error"]


def test_errors_are_anthropic_envelopes_with_the_right_status(native: NativeGateway) -> None:
    message = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.AuthenticationError) as caught:
        anthropic.Anthropic(
            base_url=native.gateway.base_url, api_key="sk-sy-wrong", max_retries=0
        ).messages.create(model="claude", max_tokens=5, messages=message)
    assert caught.value.status_code == 401
    assert _error(caught.value)["type"] == "authentication_error"
    response = httpx.post(native.gateway.v1 + "/messages", json={"model": "claude"})
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(native).messages.create(model="claude", max_tokens=-1, messages=message)
    error = _error(caught.value)
    assert error["type"] == "invalid_request_error" and "max_tokens" in error["message"]
    with pytest.raises(anthropic.NotFoundError) as caught:
        client(native).messages.create(model="no-such-model", max_tokens=5, messages=message)
    assert _error(caught.value)["type"] == "not_found_error"
    # A field the upstream's format cannot carry is refused by name.
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(native).messages.create(
            model="gpt", max_tokens=5, messages=message, extra_body={"top_k": 3}
        )
    assert "top_k" in _error(caught.value)["message"]
    _, limited = native.gateway.create_key(name="limited", rpm=1)
    sdk = anthropic.Anthropic(base_url=native.gateway.base_url, api_key=limited, max_retries=0)
    sdk.messages.create(model="claude", max_tokens=5, messages=message)
    with pytest.raises(anthropic.RateLimitError) as caught:
        sdk.messages.create(model="claude", max_tokens=5, messages=message)
    assert caught.value.status_code == 429
    assert _error(caught.value)["type"] == "rate_limit_error"
    assert caught.value.response.headers["retry-after"]


def test_key_by_bearer_and_headers_forwarded_by_allow_list(native: NativeGateway) -> None:
    sdk = anthropic.Anthropic(
        base_url=native.gateway.base_url,
        auth_token=native.key,  # Authorization: Bearer, as some Anthropic clients send it
        max_retries=0,
        default_headers={
            "anthropic-beta": "prompt-caching-2024-07-31",
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "cookie": "session=abc",
        },
    )
    for model in ("claude", "gpt"):
        sdk.messages.create(model=model, max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    anthropic_seen = native.fleet["anthropic"].seen[-1].headers
    openai_seen = native.fleet["openai"].seen[-1].headers
    assert anthropic_seen["anthropic-beta"] == "prompt-caching-2024-07-31"
    assert "anthropic-beta" not in openai_seen  # not on that provider's list
    for seen in (anthropic_seen, openai_seen):
        assert seen["traceparent"].startswith("00-0af7651916cd43dd8448eb211c80319c-")
        assert len(seen["x-request-id"]) >= 16
        assert "cookie" not in seen
    assert anthropic_seen["anthropic-version"] == "2023-06-01"
    assert anthropic_seen["x-api-key"] == native.fleet["anthropic"].key
    assert "authorization" not in anthropic_seen
    assert openai_seen["authorization"] == f"Bearer {native.fleet['openai'].key}"


def test_count_tokens_goes_to_anthropic_only_and_is_free(native: NativeGateway) -> None:
    sdk = client(native)
    counted = sdk.messages.count_tokens(
        model="claude", messages=[{"role": "user", "content": "hi"}]
    )
    assert counted.input_tokens == 13
    assert native.fleet["anthropic"].seen[-1].path == "/v1/messages/count_tokens"
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk.messages.count_tokens(model="gpt", messages=[{"role": "user", "content": "hi"}])
    assert "does not serve /v1/messages/count_tokens" in _error(caught.value)["message"]


def test_switchyard_serve_answers_the_anthropic_sdk(native: NativeGateway, tmp_path: Path) -> None:
    """The same through ``switchyard serve`` (a process with its embedded Redis)."""
    policy = tmp_path / "routing_rules.yaml"
    policy.write_text(native_policy(native.fleet))
    with GatewayProcess(tmp_path / "data", policy, env=KEY_ENV) as served:
        _, key = served.create_key(name="serve")
        sdk = anthropic.Anthropic(base_url=served.base_url, api_key=key, max_retries=0)
        question = [{"role": "user", "content": "Weather in Paris?"}]
        for model in ("claude", "gpt"):
            with sdk.messages.stream(
                model=model, max_tokens=50, tools=TOOLS, messages=question
            ) as stream:
                final = stream.get_final_message()
            assert final.stop_reason == "tool_use" and final.content[-1].input == {"city": "Paris"}
