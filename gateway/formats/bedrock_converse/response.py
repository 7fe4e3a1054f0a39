"""Bedrock ``Converse`` answers into the internal response.

``output.message.content`` holds the blocks (``text``, ``toolUse``, ``reasoningContent``);
``stopReason`` maps onto the internal stop reasons (``guardrail_intervened`` and
``content_filtered`` are refusals). Usage: ``inputTokens`` leaves out the prompt tokens read
from and written to the cache, which Converse counts apart (``cacheReadInputTokens``,
``cacheWriteInputTokens``), while the internal record counts every prompt token, as
Anthropic's usage does. Blocks no other format has (documents, guard content) stay ``Raw``.
Converse gives an answer no id: one is made.
"""

from __future__ import annotations

import secrets
from typing import Any

from gateway.formats import internal
from gateway.formats.errors import UpstreamProtocolError
from gateway.formats.fields import dumps, load_upstream, upstream_int

NAME = "bedrock_converse"
STOPS: dict[str, internal.StopReason] = {
    "end_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "guardrail_intervened": "refusal",
    "content_filtered": "refusal",
    "model_context_window_exceeded": "context_window_exceeded",
}


def parse_response(body: bytes | str | dict[str, Any]) -> internal.ChatResponse:
    data = load_upstream(body, "Converse answer")
    output = data.get("output")
    message = output.get("message") if isinstance(output, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        raise UpstreamProtocolError("upstream Converse answer has no output.message.content")
    usage = data.get("usage")
    return internal.ChatResponse(
        id=new_id(),
        model="",
        content=[parse_block(block) for block in content],
        stop_reason=parse_stop(data.get("stopReason")),
        usage=parse_usage(usage) if isinstance(usage, dict) else None,
    )


def new_id() -> str:
    return f"bedrock-{secrets.token_hex(16)}"


def parse_stop(value: Any) -> internal.StopReason | None:
    if value is None:
        return None
    return STOPS.get(value, "end_turn")


def parse_block(block: Any) -> internal.Block:
    if not isinstance(block, dict):
        raise UpstreamProtocolError("upstream content block is not an object")
    if "text" in block:
        text = block["text"]
        if not isinstance(text, str):
            raise UpstreamProtocolError("upstream text block is not a string")
        return internal.Text(text)
    if "toolUse" in block:
        use = block["toolUse"]
        if not isinstance(use, dict):
            raise UpstreamProtocolError("upstream toolUse is not an object")
        tool_input = use.get("input")
        return internal.ToolCall(
            id=_string(use, "toolUseId"),
            name=_string(use, "name"),
            arguments="" if tool_input is None else dumps(tool_input),
        )
    if "reasoningContent" in block:
        reasoning = block["reasoningContent"]
        if isinstance(reasoning, dict) and isinstance(reasoning.get("redactedContent"), str):
            return internal.RedactedThinking(reasoning["redactedContent"])
        text = reasoning.get("reasoningText") if isinstance(reasoning, dict) else None
        if not isinstance(text, dict):
            raise UpstreamProtocolError("upstream reasoningContent has no reasoningText")
        signature = text.get("signature")
        return internal.Thinking(
            _string(text, "text"),
            signature if isinstance(signature, str) and signature else None,
            origin=NAME,
        )
    return internal.Raw(NAME, block)


def parse_usage(usage: dict[str, Any]) -> internal.Usage:
    uncached = upstream_int(usage, "inputTokens", "usage")
    read = upstream_int(usage, "cacheReadInputTokens", "usage")
    written = upstream_int(usage, "cacheWriteInputTokens", "usage")
    return internal.Usage(
        prompt_tokens=uncached + read + written,
        completion_tokens=upstream_int(usage, "outputTokens", "usage"),
        cached_tokens=read,
        cache_write_tokens=written,
    )


def _string(parent: dict[str, Any], key: str) -> str:
    value = parent.get(key)
    if not isinstance(value, str):
        raise UpstreamProtocolError(f"upstream block has no {key}")
    return value
