"""Chat Completions answers: an upstream's ``chat.completion`` into the internal response, and back.

Reasoning text travels in ``message.reasoning_content`` (the field DeepSeek, vLLM and others use;
``reasoning`` is read too), since the official format has none. Only one choice translates: an
``n > 1`` answer exists only when client and upstream both speak Chat Completions, and then the
gateway relays the body untouched. The pieces both directions share (tool calls, a message's
texts, the head of a completion or chunk) are here for the request and stream renderers too.

``ChatCompletion`` is the answer of /v1/chat/completions and /v1/completions as the OpenAPI
document describes it: what ``render_response`` builds and what a provider of the client's
format answers (relayed untouched, the local engine's too) have in common.
"""

from __future__ import annotations

import time
from typing import Any, NotRequired, TypedDict

from gateway.formats import internal, stream
from gateway.formats.errors import UpstreamProtocolError
from gateway.formats.fields import load_upstream
from gateway.formats.openai_usage import parse_openai_usage
from gateway.formats.portability import raw_output

NAME = "openai_chat"

FINISH_TO_STOP: dict[str, internal.StopReason] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
STOP_TO_FINISH: dict[str, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


class ChatUsage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # The gateway's own answers have them; a provider's, relayed, may not.
    prompt_tokens_details: NotRequired[dict[str, int]]
    completion_tokens_details: NotRequired[dict[str, int]]


class ChatCompletion(TypedDict):
    """A ``chat.completion`` (``text_completion`` on /v1/completions): the gateway's,
    translated from another format's answer, or the provider's, relayed as it sent it (only
    ``id``, ``object`` and ``choices`` are sure there)."""

    id: str
    object: str
    created: NotRequired[int]
    model: NotRequired[str]
    choices: list[dict[str, Any]]
    usage: NotRequired[ChatUsage]


def parse_response(body: bytes | str | dict[str, Any]) -> internal.ChatResponse:
    data = load_upstream(body, "chat completion")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise UpstreamProtocolError("upstream chat completion has no choices")
    if len(choices) > 1:
        raise UpstreamProtocolError("an answer with several choices cannot be translated")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise UpstreamProtocolError("upstream chat completion choice has no message")
    usage = data.get("usage")
    return internal.ChatResponse(
        id=str(data.get("id") or ""),
        model=str(data.get("model") or ""),
        content=_parse_message(message),
        stop_reason=FINISH_TO_STOP.get(choice.get("finish_reason") or "stop", "end_turn"),
        usage=parse_usage(usage) if isinstance(usage, dict) else None,
        created=data.get("created") if isinstance(data.get("created"), int) else None,
    )


def reasoning_text(message: dict[str, Any]) -> str | None:
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str):
            return value
    return None


def _parse_message(message: dict[str, Any]) -> list[internal.Block]:
    blocks: list[internal.Block] = []
    thinking = reasoning_text(message)
    if thinking:
        blocks.append(internal.Thinking(thinking))
    content = message.get("content")
    if isinstance(content, str) and content:
        blocks.append(internal.Text(content))
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        blocks.append(internal.Refusal(refusal))
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise UpstreamProtocolError("upstream message.tool_calls is not a list")
    for call in calls:
        blocks.append(_parse_tool_call(call))
    return blocks


def _parse_tool_call(call: Any) -> internal.Block:
    if not isinstance(call, dict):
        raise UpstreamProtocolError("upstream tool call is not an object")
    if call.get("type", "function") != "function":
        return internal.Raw(NAME, call)
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise UpstreamProtocolError("upstream tool call has no function name")
    arguments = function.get("arguments")
    return internal.ToolCall(
        id=str(call.get("id") or ""),
        name=function["name"],
        arguments=arguments if isinstance(arguments, str) else "",
    )


def parse_usage(usage: dict[str, Any]) -> internal.Usage:
    return parse_openai_usage(usage, "prompt", "completion")


def render_usage(usage: internal.Usage) -> ChatUsage:
    prompt_details: dict[str, int] = {"cached_tokens": usage.cached_tokens}
    if usage.cache_write_tokens:
        prompt_details["cache_write_tokens"] = usage.cache_write_tokens
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": prompt_details,
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def finish_reason(stop: internal.StopReason | None) -> str:
    return STOP_TO_FINISH.get(stop or "end_turn", "stop")


def texts_of(
    blocks: list[internal.Block], kind: type[internal.Text | internal.Refusal | internal.Thinking]
) -> list[str]:
    """The texts of the blocks of one kind, in order (a message has one field for each kind)."""
    return [block.text for block in blocks if isinstance(block, kind)]


def render_tool_call(call: internal.ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def completion_head(
    kind: str, start: internal.ChatResponse | stream.MessageStart
) -> dict[str, Any]:
    """The fields a ``chat.completion`` and every ``chat.completion.chunk`` begin with."""
    created = start.created if start.created is not None else int(time.time())
    return {"id": start.id, "object": kind, "created": created, "model": start.model}


def render_response(
    response: internal.ChatResponse, request: object | None = None
) -> ChatCompletion:
    """A ``chat.completion`` body; ``request`` is accepted for symmetry and not needed here."""
    texts = texts_of(response.content, internal.Text)
    refusals = texts_of(response.content, internal.Refusal)
    thinking = texts_of(response.content, internal.Thinking)
    # RedactedThinking has no readable text and no field here.
    calls = [
        render_tool_call(block) if isinstance(block, internal.ToolCall) else raw_output(block, NAME)
        for block in response.content
        if isinstance(block, internal.ToolCall | internal.Raw)
    ]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts or not (calls or refusals) else None,
        "refusal": "".join(refusals) if refusals else None,
    }
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    body: ChatCompletion = {
        **completion_head("chat.completion", response),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason(response.stop_reason),
                "logprobs": None,
            }
        ],
    }
    if response.usage is not None:
        body["usage"] = render_usage(response.usage)
    return body
