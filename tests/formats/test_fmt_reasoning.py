"""Reasoning continuity: a provider's proof (Anthropic's signature, the Responses API's
encrypted_content and item id) goes through a client of any format and back to its own
provider intact, and never to another provider, which could not verify it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
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
from gateway.formats.internal import FormatName
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


@dataclass(frozen=True)
class Side:
    """A provider's format in a round trip: how its answers and its clients' requests carry a
    proof, and the proofs a request to the provider holds."""

    answer: dict[str, Any]  # the provider's answer: its model, and its proof first in its items
    proof_at: tuple[str, str]  # an answer's list of items, and the field of an item's proof
    follow_up: Callable[[list[dict[str, Any]]], dict[str, Any]]  # a client's next request
    proofs_sent: Callable[[dict[str, Any]], list[dict[str, Any]]]


SIDES: dict[FormatName, Side] = {
    "anthropic_messages": Side(
        answer=ANTHROPIC_MESSAGE,
        proof_at=("content", "signature"),
        follow_up=_anthropic_follow_up,
        proofs_sent=_thinking_sent_to_anthropic,
    ),
    "openai_responses": Side(
        answer=RESPONSES_RESPONSE,
        proof_at=("output", "encrypted_content"),
        follow_up=_responses_follow_up,
        proofs_sent=_reasoning_sent_to_responses,
    ),
}


@pytest.mark.parametrize(
    ("upstream", "client"),
    [("anthropic_messages", "openai_responses"), ("openai_responses", "anthropic_messages")],
)
def test_a_proof_through_a_client_of_another_format(
    upstream: FormatName, client: FormatName
) -> None:
    own, other = SIDES[upstream], SIDES[client]
    source, shown_as = wire_format(upstream), wire_format(client)
    shown = shown_as.render_response(source.parse_response(own.answer))
    items, proof = other.proof_at
    assert shown[items][0][proof].startswith(PREFIX)
    follow_up = shown_as.parse_request(other.follow_up(shown[items]))
    to_upstream = source.render_request(follow_up, own.answer["model"])
    check_request(upstream, to_upstream)
    # Back to its own provider as that provider sent it.
    assert own.proofs_sent(to_upstream) == [own.answer[own.proof_at[0]][0]]
    # The client's own provider could not verify the proof: it is not sent there.
    assert other.proofs_sent(shown_as.render_request(follow_up, other.answer["model"])) == []


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
