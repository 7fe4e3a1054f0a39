"""The cloud provider kinds end to end: the Gemini API, Vertex AI (Gemini and Claude) and Amazon
Bedrock, each behind a loopback upstream that speaks its wire format and checks its
authentication the way the provider does (the Gemini API key; a Vertex bearer token minted from
a test service-account key, whose JWT assertion the token endpoint verifies; a Bedrock
Signature V4 the upstream recomputes with botocore).

The official SDKs are the clients: the openai SDK on /v1/chat/completions and /v1/responses,
the anthropic SDK on /v1/messages, each answered whole and streamed, each a two-turn tool
round trip (the model calls the tool, the client answers it, the model reads the result).
Then the key's usage report must equal the upstreams' own books, to the token and the
nano-dollar; a throttled Bedrock model falls back; a wrong credential is the gateway's 502.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from cloud_gateway import (
    CATALOGUE_MODEL,
    CLOUD_MODELS,
    CLOUD_PRICES,
    CloudUpstreams,
    cloud_env,
    cloud_policy,
    price_cost,
)
from gateway_runner import GatewayThread, RunningGateway, make_settings
from genai_prices import Usage as PriceUsage
from genai_prices import calc_price

PROMPT = "What is the weather in Paris?"
TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
FAKE_OF = {"gemini-flash": "gemini", "vertex-gemini": "vertex", "vertex-claude": "vertex"}
FAKE_OF["bedrock-claude"] = "bedrock"


@pytest.fixture(scope="module")
def clouds(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[tuple[RunningGateway, CloudUpstreams]]:
    root: Path = tmp_path_factory.mktemp("clouds")
    with pytest.MonkeyPatch.context() as env, CloudUpstreams(root) as fleet:
        for name, value in cloud_env(root).items():
            env.setenv(name, value)
        env.delenv("AWS_SESSION_TOKEN", raising=False)
        env.delenv("AWS_PROFILE", raising=False)
        env.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
        policy = root / "routing_rules.yaml"
        policy.write_text(cloud_policy(fleet))
        settings = make_settings(root / "data", policy, redis_url, upstream_read_timeout_s=30.0)
        with GatewayThread(settings) as gateway:
            yield gateway, fleet


def _chat(gateway: RunningGateway, key: str, model: str, stream: bool) -> tuple[str, Any]:
    """A tool call, answered, then the model's text: (the text, the last answer's usage)."""
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=30)
    tools = [{"type": "function", "function": TOOL}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
    calls, usage = _chat_turn(client, model, messages, tools, stream)
    assert calls and calls[0]["function"]["name"] == "get_weather", (model, stream)
    assert orjson.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    messages.append({"role": "assistant", "content": None, "tool_calls": calls})
    messages.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": "18 C, cloudy"})
    text, usage = _chat_turn(client, model, messages, tools, stream)
    return text, usage


def _chat_turn(
    client: openai.OpenAI, model: str, messages: list[Any], tools: list[Any], stream: bool
) -> tuple[Any, Any]:
    args: dict[str, Any] = {"model": model, "messages": messages, "tools": tools, "max_tokens": 64}
    if not stream:
        reply = client.chat.completions.create(**args)
        message = reply.choices[0].message
        if message.tool_calls:
            assert reply.choices[0].finish_reason == "tool_calls"
            return [call.model_dump() for call in message.tool_calls], reply.usage
        return message.content or "", reply.usage
    with client.chat.completions.stream(**args, stream_options={"include_usage": True}) as events:
        final = events.get_final_completion()
    message = final.choices[0].message
    if message.tool_calls:
        return [
            {"id": c.id, "type": "function", "function": c.function.model_dump()}
            for c in message.tool_calls
        ], final.usage
    return message.content or "", final.usage


def _messages(gateway: RunningGateway, key: str, model: str, stream: bool) -> tuple[str, Any]:
    client = anthropic.Anthropic(base_url=gateway.base_url, api_key=key, max_retries=0)
    tools = [
        {
            "name": TOOL["name"],
            "description": TOOL["description"],
            "input_schema": TOOL["parameters"],
        }
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
    first = _messages_turn(client, model, messages, tools, stream)
    assert first.stop_reason == "tool_use", (model, stream)
    call = next(block for block in first.content if block.type == "tool_use")
    assert call.name == "get_weather" and call.input == {"city": "Paris"}
    messages.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
    messages.append(
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 C, cloudy"}],
        }
    )
    final = _messages_turn(client, model, messages, tools, stream)
    assert final.stop_reason == "end_turn"
    return "".join(b.text for b in final.content if b.type == "text"), final.usage


def _messages_turn(
    client: anthropic.Anthropic, model: str, messages: list[Any], tools: list[Any], stream: bool
) -> Any:
    args = {"model": model, "max_tokens": 64, "messages": messages, "tools": tools}
    if not stream:
        return client.messages.create(**args)
    with client.messages.stream(**args) as events:
        return events.get_final_message()


def _responses(gateway: RunningGateway, key: str, model: str, stream: bool) -> tuple[str, Any]:
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=30)
    tools = [{"type": "function", **TOOL}]
    items: list[Any] = [{"role": "user", "content": PROMPT}]
    first = _responses_turn(client, model, items, tools, stream)
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "get_weather" and orjson.loads(call.arguments) == {"city": "Paris"}
    items.append(
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        }
    )
    items.append(
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, cloudy"}
    )
    final = _responses_turn(client, model, items, tools, stream)
    return final.output_text, final.usage


def _responses_turn(
    client: openai.OpenAI, model: str, items: list[Any], tools: list[Any], stream: bool
) -> Any:
    args = {"model": model, "input": items, "tools": tools, "max_output_tokens": 64}
    if not stream:
        return client.responses.create(**args)
    events = list(client.responses.create(**args, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    return events[-1].response


DOORS = {"chat": _chat, "messages": _messages, "responses": _responses}


def _tokens(usage: Any) -> tuple[int, int]:
    if hasattr(usage, "prompt_tokens"):
        return usage.prompt_tokens, usage.completion_tokens
    if hasattr(usage, "cache_read_input_tokens"):
        cached = (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
        return usage.input_tokens + cached, usage.output_tokens
    return usage.input_tokens, usage.output_tokens


@pytest.mark.parametrize("door", list(DOORS))
def test_every_door_reaches_every_cloud_kind_with_tools(
    clouds: tuple[RunningGateway, CloudUpstreams], door: str
) -> None:
    gateway, _ = clouds
    _, key = gateway.create_key(name=f"clouds-{door}")
    for model in CLOUD_MODELS:
        for stream in (False, True):
            text, usage = DOORS[door](gateway, key, model, stream)
            assert text.startswith(f"{FAKE_OF[model]} read the tool result:"), (door, model, text)
            assert "18 C, cloudy" in text, (door, model, stream)
            prompt, completion = _tokens(usage)
            assert prompt > 0 and completion > 0, (door, model, stream)


def test_the_usage_report_equals_the_upstreams_books(
    clouds: tuple[RunningGateway, CloudUpstreams],
) -> None:
    gateway, fleet = clouds
    fleet.reset()
    key_id, key = gateway.create_key(name="cloud-books")
    for call in DOORS.values():
        for model in CLOUD_MODELS:
            for stream in (False, True):
                call(gateway, key, model, stream)
    # Prompt caching: a system prompt at Gemini is an implicit cache hit; Anthropic's and
    # Bedrock's cache markers report writes and reads.
    client = anthropic.Anthropic(base_url=gateway.base_url, api_key=key, max_retries=0)
    system = [{"type": "text", "text": "long context", "cache_control": {"type": "ephemeral"}}]
    for model in CLOUD_MODELS:
        for stream in (False, True):
            args = {"model": model, "max_tokens": 8, "system": system}
            args["messages"] = [{"role": "user", "content": "hello"}]
            if stream:
                with client.messages.stream(**args) as events:
                    usage = events.get_final_message().usage
            else:
                usage = client.messages.create(**args).usage
            assert usage.cache_read_input_tokens, (model, stream)
    gateway.wait_exported()
    report = httpx.get(
        gateway.v1 + "/usage", headers={"Authorization": f"Bearer {key}"}, timeout=30
    ).json()
    rows = {row["model"]: row for row in report["by_model"]}
    total_cost = 0
    for model, (fake, upstream_model) in CLOUD_MODELS.items():
        book = fleet[fake].books()[upstream_model]
        row = rows[model]
        assert row["requests"] == book["requests"] == 14, model
        for field in ("prompt_tokens", "completion_tokens", "cached_tokens"):
            assert row[field] == book[field], (model, field)
        cost = price_cost(CLOUD_PRICES[model], book)
        assert row["cost_nanos"] == cost, model
        total_cost += cost
    assert report["total_cost_nanos"] == total_cost
    written = {m: fleet[f].books()[u]["cache_write_tokens"] for m, (f, u) in CLOUD_MODELS.items()}
    assert written["vertex-claude"] > 0 and written["bedrock-claude"] > 0
    with gateway.admin() as admin:
        events = admin.get("/admin/usage/events", params={"key": key_id, "limit": 200}).json()
    by_model: dict[str, int] = {}
    for event in events["data"]:
        by_model[event["model"]] = by_model.get(event["model"], 0) + event["cache_write_tokens"]
        assert event["usage_source"] == "provider" and event["status"] == 200
    assert by_model == written


def test_each_upstream_saw_its_own_authentication_and_paths(
    clouds: tuple[RunningGateway, CloudUpstreams],
) -> None:
    gateway, fleet = clouds
    _, key = gateway.create_key(name="cloud-paths")
    for model in CLOUD_MODELS:
        _chat(gateway, key, model, stream=True)
    gemini = fleet["gemini"].seen
    assert {s.path for s in gemini} >= {
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent",
    }
    assert all(s.headers["x-goog-api-key"] for s in gemini)
    vertex = fleet["vertex"]
    paths = {s.path for s in vertex.seen}
    base = "/v1/projects/switchyard-test/locations/us-central1/publishers"
    assert f"{base}/google/models/gemini-2.5-pro:streamGenerateContent" in paths
    assert f"{base}/anthropic/models/claude-sonnet-4@20250514:streamRawPredict" in paths
    assert vertex.assertions, "the token endpoint verified a JWT assertion"
    assert all(s.headers["authorization"].startswith("Bearer ya29.") for s in vertex.seen)
    bedrock = fleet["bedrock"].seen
    assert any(s.path.endswith("/converse-stream") for s in bedrock)
    assert all(s.headers["authorization"].startswith("AWS4-HMAC-SHA256 ") for s in bedrock)


def test_a_throttled_bedrock_model_falls_back(
    clouds: tuple[RunningGateway, CloudUpstreams],
) -> None:
    """Bedrock's ThrottlingException is a 429: the dispatcher moves on to the fallback."""
    gateway, fleet = clouds
    _, key = gateway.create_key(name="cloud-throttle")
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=30)
    for stream in (False, True):
        reply = client.chat.completions.with_raw_response.create(
            model="bedrock-throttled", messages=[{"role": "user", "content": "hi"}], stream=stream
        )
        assert reply.headers["x-switchyard-model"] == "bedrock-claude"
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in reply.parse() if c.choices)
        else:
            text = reply.parse().choices[0].message.content
        assert text == "bedrock says: hi"
    throttled = [s for s in fleet["bedrock"].seen if "throttled-model" in s.path]
    assert len(throttled) >= 2


def test_a_gemini_model_without_a_price_is_costed_from_the_catalogue(
    clouds: tuple[RunningGateway, CloudUpstreams],
) -> None:
    """``gemini-catalogue`` has no ``price:``: its cost is the catalogue's price of the tokens
    Gemini counted, to the nano-dollar (computed here by genai-prices itself, in Decimal), and
    each of its usage events names the catalogue's version."""
    gateway, fleet = clouds
    fleet.reset()
    key_id, key = gateway.create_key(name="cloud-catalogue")
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=30)
    for stream in (False, True):
        messages = [
            {"role": "system", "content": "Be brief."},  # an implicit cache hit at the fake
            {"role": "user", "content": "hello"},
        ]
        reply = client.chat.completions.create(
            model="gemini-catalogue", messages=messages, stream=stream
        )
        if stream:
            list(reply)
    book = fleet["gemini"].books()[CATALOGUE_MODEL]
    assert book["requests"] == 2 and book["cached_tokens"] > 0
    cost = calc_price(
        PriceUsage(
            input_tokens=book["prompt_tokens"],
            cache_read_tokens=book["cached_tokens"],
            output_tokens=book["completion_tokens"],
        ),
        CATALOGUE_MODEL,
        provider_id="google",
    ).total_price
    nanos = cost.scaleb(9)
    assert nanos == nanos.to_integral_value()  # whole nano-dollars: nothing was rounded
    version = f"genai-prices {metadata.version('genai-prices')}"
    gateway.wait_exported()
    with gateway.admin() as admin:
        events = admin.get("/admin/usage/events", params={"key": key_id, "limit": 10}).json()
        explained = admin.post(
            "/admin/route/explain", json={"body": {"model": "gemini-catalogue"}}
        ).json()
    assert len(events["data"]) == 2
    assert {event["price_catalogue"] for event in events["data"]} == {version}
    assert sum(event["cost_nanos"] for event in events["data"]) == int(nanos)
    price = explained["candidates"][0]["price"]
    assert price["source"] == version and price["catalogue_model"] == CATALOGUE_MODEL
    report = httpx.get(
        gateway.v1 + "/usage", headers={"Authorization": f"Bearer {key}"}, timeout=30
    ).json()
    assert report["total_cost_nanos"] == int(nanos)
    with gateway.admin() as admin:
        priced = admin.post("/admin/route/explain", json={"body": {"model": "gemini-flash"}}).json()
    assert priced["candidates"][0]["price"]["source"] == "policy"


# model -> (fake, upstream model, whether the provider counts the tokens)
EMBEDDERS = {
    "gemini-embed": ("gemini", "text-embedding-004", False),
    "vertex-embed": ("vertex", "text-embedding-005", True),
    "bedrock-titan": ("bedrock", "amazon.titan-embed-text-v2:0", True),
    "bedrock-cohere": ("bedrock", "cohere.embed-english-v3", False),
}


def test_embeddings_reach_every_cloud_kind(clouds: tuple[RunningGateway, CloudUpstreams]) -> None:
    """The openai SDK asks for base64 by default; floats are asked for too. What a provider
    counts is what is recorded; Gemini's and Cohere's embeddings count nothing: estimated."""
    gateway, fleet = clouds
    fleet.reset()
    key_id, key = gateway.create_key(name="cloud-embed")
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=30)
    texts = ["the weather in Paris", "rain"]
    for model, (fake, upstream_model, counted) in EMBEDDERS.items():
        reply = client.embeddings.create(model=model, input=texts)
        floats = client.embeddings.create(model=model, input="rain", encoding_format="float")
        assert [item.index for item in reply.data] == [0, 1]
        assert reply.data[1].embedding == floats.data[0].embedding  # base64 decodes the same
        assert len(reply.data[0].embedding) >= 2
        if counted:
            book = fleet[fake].books()[upstream_model]
            assert reply.usage.prompt_tokens + floats.usage.prompt_tokens == book["prompt_tokens"]
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model="gemini-embed", input=[[1, 2, 3]])
    assert refused.value.body["param"] == "input[0]"  # type: ignore[index]
    gateway.wait_exported()
    with gateway.admin() as admin:
        events = admin.get("/admin/usage/events", params={"key": key_id, "limit": 50}).json()
    sources = {(e["model"], e["usage_source"]) for e in events["data"] if e["status"] == 200}
    assert sources == {
        (model, "provider" if counted else "estimated")
        for model, (_, _, counted) in EMBEDDERS.items()
    }


def test_token_counting_reaches_every_cloud_kind(
    clouds: tuple[RunningGateway, CloudUpstreams],
) -> None:
    gateway, _ = clouds
    _, key = gateway.create_key(name="cloud-count")
    client = anthropic.Anthropic(base_url=gateway.base_url, api_key=key, max_retries=0)
    messages = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "weather?"},
    ]
    expected = {"gemini-flash": 24, "vertex-gemini": 24, "vertex-claude": 19, "bedrock-claude": 24}
    for model, tokens in expected.items():
        counted = client.messages.count_tokens(
            model=model,
            messages=messages,
            system="Be brief.",
            tools=[{"name": "get_weather", "input_schema": TOOL["parameters"]}],
        )
        assert counted.input_tokens == tokens, model
