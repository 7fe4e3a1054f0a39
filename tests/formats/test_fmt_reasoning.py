"""Reasoning continuity: a provider's proof (Anthropic's signature, the Responses API's
encrypted_content and item id) goes through a client of any format and back to its own
provider intact, and never to another provider, which could not verify it."""

from __future__ import annotations

from typing import Any

from fmt_samples import (
    ANTHROPIC_MESSAGE,
    ANTHROPIC_STREAM,
    REASONING_ITEM,
    RESPONSES_RESPONSE,
    SIGNATURE,
    THOUGHT,
    responses_stream,
)
from fmt_support import (
    accumulate_anthropic,
    accumulate_responses,
    check_request,
    parse_stream,
    render_stream,
    sse,
)

from gateway.formats import wire_format
from gateway.formats.signatures import PREFIX

ANTHROPIC = wire_format("anthropic_messages")
RESPONSES = wire_format("openai_responses")
CHAT = wire_format("openai_chat")


def _responses_follow_up(output: list[dict[str, Any]]) -> dict[str, Any]:
    """What a Responses client sends next: its question, the answer's items, the tool output."""
    call = next(item for item in output if item["type"] == "function_call")
    return {
        "model": "m",
        "input": [
            {"role": "user", "content": "Weather in Paris?"},
            *output,
            {"type": "function_call_output", "call_id": call["call_id"], "output": "18°C"},
        ],
    }


def _anthropic_follow_up(content: list[dict[str, Any]]) -> dict[str, Any]:
    call = next(block for block in content if block["type"] == "tool_use")
    return {
        "model": "m",
        "max_tokens": 100,
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "18°C"}],
            },
        ],
    }


def _thinking_sent_to_anthropic(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for m in body["messages"] for b in m["content"] if b["type"] == "thinking"]


def _reasoning_sent_to_responses(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in body["input"] if item.get("type") == "reasoning"]


def test_anthropic_signature_through_a_responses_client() -> None:
    answer = ANTHROPIC.parse_response(ANTHROPIC_MESSAGE)
    shown = RESPONSES.render_response(answer)
    reasoning = shown["output"][0]
    assert reasoning["encrypted_content"].startswith(PREFIX)
    follow_up = RESPONSES.parse_request(_responses_follow_up(shown["output"]))
    to_anthropic = ANTHROPIC.render_request(follow_up, "claude")
    check_request("anthropic_messages", to_anthropic)
    assert _thinking_sent_to_anthropic(to_anthropic) == [
        {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE}
    ]
    # OpenAI could not verify Anthropic's proof: it is not sent there.
    assert _reasoning_sent_to_responses(RESPONSES.render_request(follow_up, "o4")) == []


def test_responses_reasoning_through_an_anthropic_client() -> None:
    answer = RESPONSES.parse_response(RESPONSES_RESPONSE)
    shown = ANTHROPIC.render_response(answer)
    thinking = shown["content"][0]
    assert thinking["signature"].startswith(PREFIX)
    follow_up = ANTHROPIC.parse_request(_anthropic_follow_up(shown["content"]))
    to_responses = RESPONSES.render_request(follow_up, "o4")
    check_request("openai_responses", to_responses)
    assert _reasoning_sent_to_responses(to_responses) == [
        {
            "type": "reasoning",
            "id": REASONING_ITEM["id"],
            "summary": [{"type": "summary_text", "text": THOUGHT}],
            "encrypted_content": REASONING_ITEM["encrypted_content"],
        }
    ]
    assert _thinking_sent_to_anthropic(ANTHROPIC.render_request(follow_up, "claude")) == []


def test_native_proofs_stay_unwrapped() -> None:
    anthropic = ANTHROPIC.render_response(ANTHROPIC.parse_response(ANTHROPIC_MESSAGE))
    assert anthropic["content"][0]["signature"] == SIGNATURE
    responses = RESPONSES.render_response(RESPONSES.parse_response(RESPONSES_RESPONSE))
    assert responses["output"][0] == {**REASONING_ITEM}


def test_streamed_proofs_round_trip_too() -> None:
    # Anthropic upstream stream -> Responses client stream -> follow-up -> Anthropic upstream.
    events = parse_stream("anthropic_messages", sse(ANTHROPIC_STREAM))
    response, _ = accumulate_responses(render_stream("openai_responses", events))
    output = [item.model_dump(exclude_none=True) for item in response.output]
    follow_up = RESPONSES.parse_request(_responses_follow_up(output))
    sent = _thinking_sent_to_anthropic(ANTHROPIC.render_request(follow_up, "claude"))
    assert sent == [{"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE}]
    # Responses upstream stream -> Anthropic client stream -> follow-up -> Responses upstream.
    events = parse_stream("openai_responses", sse(responses_stream()))
    message = accumulate_anthropic(render_stream("anthropic_messages", events))
    content = [block.model_dump(exclude_none=True) for block in message.content]
    follow_up = ANTHROPIC.parse_request(_anthropic_follow_up(content))
    (item,) = _reasoning_sent_to_responses(RESPONSES.render_request(follow_up, "o4"))
    assert (item["id"], item["encrypted_content"]) == (
        REASONING_ITEM["id"],
        REASONING_ITEM["encrypted_content"],
    )


def test_chat_clients_see_reasoning_text_only() -> None:
    shown = CHAT.render_response(ANTHROPIC.parse_response(ANTHROPIC_MESSAGE))
    assert shown["choices"][0]["message"]["reasoning_content"] == THOUGHT
    assert SIGNATURE not in str(shown)
