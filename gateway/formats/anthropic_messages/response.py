"""Anthropic Messages answers: an upstream's ``message`` into the internal response, and back.

Usage is where the formats differ most: Anthropic's ``input_tokens`` leaves out cache reads and
writes, which it counts apart, while the internal record (like OpenAI) counts every prompt token
in ``prompt_tokens``. Both directions are exact. Refusals become text (Anthropic marks them with
``stop_reason: refusal``); tool inputs must be JSON objects, so arguments a model wrote as
anything else cannot be shown to an Anthropic client (502).

``AnthropicMessage`` is the answer of /v1/messages as the OpenAPI document describes it: what
``render_response`` builds and what an Anthropic provider answers (relayed untouched) have in
common; ``TokenCount`` that of /v1/messages/count_tokens.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict, get_args

import orjson

from gateway.formats import internal
from gateway.formats.errors import UpstreamProtocolError
from gateway.formats.fields import dumps, load_upstream, upstream_int
from gateway.formats.portability import raw_output
from gateway.formats.signatures import for_client

NAME = "anthropic_messages"

# The internal stop reasons are Anthropic's, one of them under a shorter name.
_ANTHROPIC_NAMES = {"context_window_exceeded": "model_context_window_exceeded"}
TO_STOP: dict[str, internal.StopReason] = {
    _ANTHROPIC_NAMES.get(reason, reason): reason for reason in get_args(internal.StopReason)
}
FROM_STOP: dict[str, str] = {value: key for key, value in TO_STOP.items()}


class AnthropicMessage(TypedDict):
    """Anthropic's ``message``: the gateway's, translated from another format's answer, or
    an Anthropic provider's, relayed as it sent it."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: NotRequired[str]
    content: list[dict[str, Any]]
    stop_reason: NotRequired[str | None]
    stop_sequence: NotRequired[str | None]
    usage: dict[str, Any]


class TokenCount(TypedDict):
    """A request's input tokens: an Anthropic provider's count, relayed, or another
    provider's (Gemini's, Vertex AI's, Bedrock's) in Anthropic's shape."""

    input_tokens: int


def parse_response(body: bytes | str | dict[str, Any]) -> internal.ChatResponse:
    data = load_upstream(body, "message")
    content = data.get("content")
    if not isinstance(content, list):
        raise UpstreamProtocolError("upstream message has no content list")
    usage = data.get("usage")
    stop = data.get("stop_sequence")
    return internal.ChatResponse(
        id=str(data.get("id") or ""),
        model=str(data.get("model") or ""),
        content=[parse_block(block) for block in content],
        stop_reason=parse_stop(data.get("stop_reason")),
        usage=parse_usage(usage) if isinstance(usage, dict) else None,
        stop_sequence=stop if isinstance(stop, str) else None,
    )


def parse_stop(value: Any) -> internal.StopReason | None:
    if value is None:
        return None
    return TO_STOP.get(value, "end_turn")


def parse_block(block: Any) -> internal.Block:
    if not isinstance(block, dict):
        raise UpstreamProtocolError("upstream content block is not an object")
    kind = block.get("type")
    if kind == "text":
        return internal.Text(_text(block, "text"))
    if kind == "tool_use":
        tool_input = block.get("input")
        return internal.ToolCall(
            id=_text(block, "id"),
            name=_text(block, "name"),
            arguments="" if tool_input is None else dumps(tool_input),
        )
    if kind == "thinking":
        signature = block.get("signature") or None
        return internal.Thinking(_text(block, "thinking"), signature, origin=NAME)
    if kind == "redacted_thinking":
        return internal.RedactedThinking(_text(block, "data"))
    return internal.Raw(NAME, block)


def _text(block: dict[str, Any], key: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise UpstreamProtocolError(f"upstream {block.get('type')} block has no {key}")
    return value


def parse_usage(usage: dict[str, Any], base: internal.Usage | None = None) -> internal.Usage:
    """Anthropic's usage as the internal record; ``base`` supplies fields a delta leaves out."""
    base = base or internal.Usage()
    uncached = _count(usage, "input_tokens", base.uncached_prompt_tokens)
    read = _count(usage, "cache_read_input_tokens", base.cached_tokens)
    write = _count(usage, "cache_creation_input_tokens", base.cache_write_tokens)
    details = usage.get("output_tokens_details")
    thinking = base.reasoning_tokens
    if isinstance(details, dict):
        thinking = upstream_int(details, "thinking_tokens", "usage.output_tokens_details")
    return internal.Usage(
        prompt_tokens=uncached + read + write,
        completion_tokens=_count(usage, "output_tokens", base.completion_tokens),
        cached_tokens=read,
        cache_write_tokens=write,
        reasoning_tokens=thinking,
    )


def _count(usage: dict[str, Any], key: str, default: int) -> int:
    return default if usage.get(key) is None else upstream_int(usage, key, "usage")


def render_usage(usage: internal.Usage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "input_tokens": usage.uncached_prompt_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": usage.cache_write_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
    }
    if usage.reasoning_tokens:
        out["output_tokens_details"] = {"thinking_tokens": usage.reasoning_tokens}
    return out


def render_stop(stop: internal.StopReason | None) -> str:
    return FROM_STOP.get(stop or "end_turn", "end_turn")


def render_block(block: internal.Block) -> dict[str, Any]:
    """An output block as Anthropic shows it."""
    if isinstance(block, internal.Text | internal.Refusal):
        return {"type": "text", "text": block.text}
    if isinstance(block, internal.ToolCall):
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": tool_input(block)}
    if isinstance(block, internal.Thinking):
        signature = for_client(block, NAME) or ""
        return {"type": "thinking", "thinking": block.text, "signature": signature}
    if isinstance(block, internal.RedactedThinking):
        return {"type": "redacted_thinking", "data": block.data}
    if isinstance(block, internal.Raw):
        return raw_output(block, NAME)
    raise UpstreamProtocolError(f"the upstream answered with {type(block).__name__} content")


def tool_input(call: internal.ToolCall) -> dict[str, Any]:
    if not call.arguments.strip():
        return {}
    try:
        value = orjson.loads(call.arguments)
    except orjson.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise UpstreamProtocolError(
            f"the model's arguments for tool {call.name!r} are not a JSON object"
        )
    return value


def render_response(
    response: internal.ChatResponse, request: object | None = None
) -> AnthropicMessage:
    """A ``message`` body; ``request`` is accepted for symmetry and not needed here."""
    content = [render_block(block) for block in response.content]
    usage = render_usage(response.usage or internal.Usage())
    return {
        "id": response.id,
        "type": "message",
        "role": "assistant",
        "model": response.model,
        "content": content,
        "stop_reason": render_stop(response.stop_reason),
        "stop_sequence": response.stop_sequence,
        "usage": usage,
    }
