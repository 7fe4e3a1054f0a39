"""Tool calling through a real gateway serving the local engine (tiny random-weight Qwen3, whose
chat template renders ``tools`` and ``role: tool`` turns as Qwen3's does).

``tool_choice`` ``required`` and a named function are guaranteed by the grammar: even random
weights produce a call to an offered function whose arguments validate against its schema,
through the official openai and anthropic SDKs, the Responses API, streamed and not.
"""

from __future__ import annotations

import json
import re

import anthropic
import openai
import pytest
from openai import OpenAI
from tool_cases import ASK, TOOLS, WEATHER_PARAMETERS, check_call, responses_round_trip

# enough for a call of the bounded tools at random (a few dozen tokens each)
MAX_TOKENS = 200


@pytest.fixture
def client(local_gateway, api_key) -> OpenAI:
    return OpenAI(base_url=local_gateway.v1, api_key=api_key, max_retries=0, timeout=120)


def test_the_template_renders_tools_calls_and_results(tokenizer):
    calls = [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}]
    text = tokenizer.apply_chat_template(
        [
            *ASK,
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "3", "tool_call_id": "c1"},
        ],
        tools=TOOLS,
    )
    assert "<tools>\n" + json.dumps(TOOLS[0]) in text
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>" in text
    # no tools, no tool turns: plain ChatML, as before
    assert tokenizer.apply_chat_template(ASK) == (
        "<|im_start|>user\n" + ASK[0]["content"] + "<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("seed", [1, 2])
def test_required_makes_a_valid_call(client, seed):
    reply = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        seed=seed,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and call.type == "function"
    check_call(call.function.name, call.function.arguments)


def test_required_with_parallel_calls_makes_valid_calls(client):
    reply = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=4 * MAX_TOKENS,
        temperature=1.0,
        seed=7,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls
    assert len({call.id for call in choice.message.tool_calls}) == len(choice.message.tool_calls)
    for call in choice.message.tool_calls:
        check_call(call.function.name, call.function.arguments)


def test_named_tool_choice_streamed_and_not(client):
    named = {"type": "function", "function": {"name": "add"}}
    args = dict(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice=named,
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        seed=3,
    )
    whole = client.chat.completions.create(**args, logprobs=True).choices[0]
    assert whole.finish_reason == "tool_calls"
    written = "".join(entry.token for entry in whole.logprobs.content)  # the model's own text
    assert re.match(r'<tool_call>\n\{\s?"name"', written)  # Qwen's syntax, name first
    (call,) = whole.message.tool_calls
    check_call(call.function.name, call.function.arguments, only="add")
    chunks = list(client.chat.completions.create(**args, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "<tool_call>" not in content and content == ""
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == "add"
    assert deltas[0].type == "function" and all(d.index == 0 for d in deltas)
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(arguments) == json.loads(call.function.arguments)  # same seed
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_sdk_stream_helper_collects_the_call(client):
    with client.chat.completions.stream(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=MAX_TOKENS,
        seed=11,
    ) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in events
    (call,) = final.choices[0].message.tool_calls
    check_call(call.function.name, call.function.arguments)


def test_a_tool_round_trip_ends_in_a_text_answer(client, tokenizer):
    first = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=MAX_TOKENS,
        seed=5,
    )
    message = first.choices[0].message
    (call,) = message.tool_calls
    arguments = check_call(call.function.name, call.function.arguments, only="get_weather")
    result = {"city": arguments["city"], "temperature": 21}
    final = client.chat.completions.create(
        model="tiny",
        messages=[
            *ASK,
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)},
        ],
        tools=TOOLS,
        tool_choice="none",
        max_tokens=8,
        temperature=0,
    )
    answer = final.choices[0]
    assert answer.message.tool_calls is None
    assert answer.message.content and answer.finish_reason in ("stop", "length")
    # the call and its result are in the prompt, as the template renders them
    rendered = tokenizer.apply_chat_template(
        [
            *ASK,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": call.function.name, "arguments": arguments}}],
            },
            {"role": "tool", "content": json.dumps(result)},
        ],
        tokenize=True,
    )
    assert final.usage.prompt_tokens == len(rendered)


def test_auto_keeps_a_malformed_call_as_text(client, tokenizer):
    """Random weights under ``auto`` write no call: the answer is text, never a 500; a bias
    that makes the model open a ``<tool_call>`` it never closes leaves that text as content."""
    reply = client.chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, max_tokens=12, temperature=0
    )
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason == "length"
    opening = tokenizer.encode("<tool_call>", add_special_tokens=False)
    bias = {str(opening[0]): 100}
    reply = client.chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, max_tokens=6, temperature=0, logit_bias=bias
    )
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content == tokenizer.decode([opening[0]] * 6)


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        (
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "not among the tools",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "broken",
                            "parameters": {"type": "object", "properties": {"a": {"$ref": "#/x"}}},
                        },
                    }
                ]
            },
            "tools[0].function.parameters",
            "cannot be compiled",
        ),
        (
            {"tool_choice": "required", "response_format": {"type": "json_object"}},
            "tool_choice",
            "one structured output constraint",
        ),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0]", "function tools only"),
    ],
)
def test_bad_tool_requests_are_400_naming_the_param(client, extra, param, words):
    body = {"tools": TOOLS, **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=ASK, max_tokens=5, **body)
    assert caught.value.body["param"] == param
    assert words in caught.value.message


def test_anthropic_sdk_tool_use_then_tool_result(local_gateway, api_key, tokenizer):
    sdk = anthropic.Anthropic(base_url=local_gateway.base_url, api_key=api_key, max_retries=0)
    tools = [
        {
            "name": "get_weather",
            "description": "The weather now.",
            "input_schema": WEATHER_PARAMETERS,
        }
    ]
    args = dict(model="tiny", max_tokens=MAX_TOKENS, tools=tools)
    message = sdk.messages.create(
        **args, messages=ASK, tool_choice={"type": "tool", "name": "get_weather"}
    )
    assert message.stop_reason == "tool_use"
    (use,) = [block for block in message.content if block.type == "tool_use"]
    check_call(use.name, use.input, only="get_weather")
    # any tool, one call (random weights would go on calling until max_tokens otherwise)
    forced_any = sdk.messages.create(
        **args, messages=ASK, tool_choice={"type": "any", "disable_parallel_tool_use": True}
    )
    (block,) = [b for b in forced_any.content if b.type == "tool_use"]
    assert forced_any.stop_reason == "tool_use"
    check_call(block.name, block.input)
    answer = sdk.messages.create(
        model="tiny",
        max_tokens=8,
        tools=tools,
        tool_choice={"type": "none"},
        messages=[
            *ASK,
            {"role": "assistant", "content": [block.model_dump() for block in message.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 C"}],
            },
        ],
    )
    assert answer.content[0].type == "text" and answer.content[0].text
    rendered = tokenizer.apply_chat_template(
        [
            *ASK,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": use.name, "arguments": use.input}}],
            },
            {"role": "tool", "content": "21 C"},
        ],
        tokenize=True,
    )
    assert answer.usage.input_tokens == len(rendered)  # the tool_use and tool_result turns


def test_responses_function_call_then_output(client):
    responses_round_trip(client, "tiny", MAX_TOKENS)


def test_anthropic_stream_carries_the_tool_use(local_gateway, api_key):
    sdk = anthropic.Anthropic(base_url=local_gateway.base_url, api_key=api_key, max_retries=0)
    tools = [
        {"name": "add", "description": "A sum.", "input_schema": TOOLS[1]["function"]["parameters"]}
    ]
    with sdk.messages.stream(
        model="tiny",
        max_tokens=MAX_TOKENS,
        tools=tools,
        tool_choice={"type": "tool", "name": "add"},
        messages=ASK,
    ) as stream:
        kinds = {event.type for event in stream}
        message = stream.get_final_message()
    assert "input_json" in kinds and message.stop_reason == "tool_use"
    (use,) = [block for block in message.content if block.type == "tool_use"]
    assert not [block for block in message.content if block.type == "text" and block.text]
    check_call(use.name, use.input, only="add")


def test_responses_stream_carries_the_function_call(client):
    tool = {"type": "function", "name": "add", "parameters": TOOLS[1]["function"]["parameters"]}
    with client.responses.stream(
        model="tiny",
        input=ASK[0]["content"],
        tools=[tool],
        tool_choice={"type": "function", "name": "add"},
        max_output_tokens=MAX_TOKENS,
    ) as stream:
        kinds = {event.type for event in stream}
        response = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    (item,) = [item for item in response.output if item.type == "function_call"]
    check_call(item.name, item.arguments, only="add")


def test_the_policy_sets_the_parser(start_gateway, checkpoint):
    """``tool_call_parser: llama3_json`` in the engine block: the forced call is Llama 3's bare
    JSON (``{"name": ..., "parameters": ...}``), parsed into the same ``tool_calls``."""
    from local_policy import local_policy

    gateway, key = start_gateway(
        local_policy(checkpoint, tool_call_parser="llama3_json", kv_cache_bytes=32 * 1024 * 1024)
    )
    sdk = OpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=120)
    args = dict(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=MAX_TOKENS,
        seed=2,
        temperature=1.0,
    )
    whole = sdk.chat.completions.create(**args, logprobs=True).choices[0]
    (call,) = whole.message.tool_calls
    check_call(call.function.name, call.function.arguments)
    written = "".join(entry.token for entry in whole.logprobs.content)  # the model's own text
    assert re.match(r'\{\s?"name"', written) and "<tool_call>" not in written
    chunks = list(sdk.chat.completions.create(**args, stream=True))
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].function.name == call.function.name
    streamed = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(streamed) == json.loads(call.function.arguments)  # same seed
