"""Responses API answers: an upstream's ``response`` object into the internal response, and back.

The Responses API has no stop reason: a finished response is ``completed`` (a tool use when it
holds ``function_call`` items), a cut one ``incomplete`` with ``max_output_tokens`` or
``content_filter``. Output items get ids derived from the response id (``msg_<id>_0``,
``fc_<id>_1``, ``rs_<id>_2``), so the same answer always renders the same. The response object
echoes the request's settings (tools, tool choice, instructions); they come from the internal
request when the caller passes it, and neutral defaults otherwise. Anthropic's redacted
thinking has no readable text and no item here, so it is left out.

``ResponseObject`` is the answer of /v1/responses as the OpenAPI document describes it: what
``response_object`` builds and what a provider of the Responses API answers (relayed
untouched) have in common.
"""

from __future__ import annotations

import time
from typing import Any, Literal, NotRequired, TypedDict

from gateway.formats import internal
from gateway.formats.errors import UpstreamProtocolError
from gateway.formats.fields import load_upstream
from gateway.formats.openai_responses.request_render import (
    render_reasoning,
    render_text,
    render_tool,
    render_tool_choice,
)
from gateway.formats.openai_usage import parse_openai_usage
from gateway.formats.portability import raw_output
from gateway.formats.signatures import for_client

NAME = "openai_responses"
_INCOMPLETE: dict[str, internal.StopReason] = {
    "max_output_tokens": "max_tokens",
    "content_filter": "refusal",
}


class ResponseObject(TypedDict):
    """A ``response`` object: the gateway's, translated from another format's answer, or
    the provider's, relayed as it sent it (only ``id``, ``object``, ``status`` and ``output``
    are sure there)."""

    id: str
    object: Literal["response"]
    created_at: NotRequired[float]
    status: str
    error: NotRequired[dict[str, Any] | None]
    incomplete_details: NotRequired[dict[str, Any] | None]
    instructions: NotRequired[str | list[dict[str, Any]] | None]
    max_output_tokens: NotRequired[int | None]
    model: NotRequired[str]
    output: list[dict[str, Any]]
    parallel_tool_calls: NotRequired[bool]
    # Stateless: a request naming a previous response is refused, and none is stored.
    previous_response_id: NotRequired[None]
    reasoning: NotRequired[dict[str, Any] | None]
    store: NotRequired[Literal[False]]
    temperature: NotRequired[float | None]
    text: NotRequired[dict[str, Any]]
    tool_choice: NotRequired[str | dict[str, Any]]
    tools: NotRequired[list[dict[str, Any]]]
    top_p: NotRequired[float | None]
    truncation: NotRequired[str | None]
    usage: NotRequired[dict[str, Any] | None]
    user: NotRequired[str | None]
    metadata: NotRequired[dict[str, Any] | None]


def parse_response(body: bytes | str | dict[str, Any]) -> internal.ChatResponse:
    data = load_upstream(body, "response")
    if data.get("status") == "failed":
        error = data.get("error") if isinstance(data.get("error"), dict) else {}
        raise UpstreamProtocolError(
            f"upstream response failed: {error.get('message') or 'no reason given'}"
        )
    output = data.get("output")
    if not isinstance(output, list):
        raise UpstreamProtocolError("upstream response has no output list")
    content: list[internal.Block] = []
    for item in output:
        content.extend(parse_item(item))
    usage = data.get("usage")
    created = data.get("created_at")
    return internal.ChatResponse(
        id=str(data.get("id") or ""),
        model=str(data.get("model") or ""),
        content=content,
        stop_reason=parse_stop(data, content),
        usage=parse_usage(usage) if isinstance(usage, dict) else None,
        created=int(created) if isinstance(created, int | float) else None,
    )


def parse_stop(data: dict[str, Any], content: list[internal.Block]) -> internal.StopReason:
    if data.get("status") == "incomplete":
        details = data.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return _INCOMPLETE.get(reason or "", "max_tokens")
    if any(isinstance(block, internal.ToolCall) for block in content):
        return "tool_use"
    return "end_turn"


def parse_item(item: Any) -> list[internal.Block]:
    if not isinstance(item, dict):
        raise UpstreamProtocolError("upstream output item is not an object")
    kind = item.get("type")
    if kind == "message":
        blocks: list[internal.Block] = []
        for part in item.get("content") or []:
            if not isinstance(part, dict):
                raise UpstreamProtocolError("upstream message content is not an object")
            if part.get("type") == "output_text":
                blocks.append(internal.Text(str(part.get("text") or "")))
            elif part.get("type") == "refusal":
                blocks.append(internal.Refusal(str(part.get("refusal") or "")))
            else:
                blocks.append(internal.Raw(NAME, part))
        return blocks
    if kind == "function_call":
        name, call_id = item.get("name"), item.get("call_id")
        if not isinstance(name, str) or not isinstance(call_id, str):
            raise UpstreamProtocolError("upstream function_call has no name or call_id")
        arguments = item.get("arguments")
        return [internal.ToolCall(call_id, name, arguments if isinstance(arguments, str) else "")]
    if kind == "reasoning":
        return [parse_reasoning(item)]
    return [internal.Raw(NAME, item)]


def parse_reasoning(item: dict[str, Any]) -> internal.Thinking:
    texts = [
        part.get("text") or ""
        for part in (item.get("summary") or item.get("content") or [])
        if isinstance(part, dict)
    ]
    signature = item.get("encrypted_content")
    return internal.Thinking(
        "\n\n".join(texts),
        signature=signature if isinstance(signature, str) else None,
        item_id=str(item.get("id") or ""),
        origin=NAME,
    )


def parse_usage(usage: dict[str, Any]) -> internal.Usage:
    return parse_openai_usage(usage, "input", "output")


def render_usage(usage: internal.Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def item_id(prefix: str, response_id: str, index: int) -> str:
    return f"{prefix}_{response_id}_{index}"


def output_item(
    block: internal.Block, response_id: str, index: int, status: str = "completed"
) -> dict[str, Any]:
    """One output item for one block: a message, a function call or a reasoning item."""
    if isinstance(block, internal.Text):
        part: dict[str, Any] = {"type": "output_text", "text": block.text, "annotations": []}
        return message_item(item_id("msg", response_id, index), [part], status)
    if isinstance(block, internal.Refusal):
        part = {"type": "refusal", "refusal": block.text}
        return message_item(item_id("msg", response_id, index), [part], status)
    if isinstance(block, internal.ToolCall):
        return {
            "type": "function_call",
            "id": item_id("fc", response_id, index),
            "call_id": block.id,
            "name": block.name,
            "arguments": block.arguments,
            "status": status,
        }
    if isinstance(block, internal.Thinking):
        own = block.origin == NAME and block.item_id
        item: dict[str, Any] = {
            "type": "reasoning",
            "id": block.item_id if own else item_id("rs", response_id, index),
            "summary": [{"type": "summary_text", "text": block.text}] if block.text else [],
        }
        signature = for_client(block, NAME)
        if signature:
            item["encrypted_content"] = signature
        return item
    if isinstance(block, internal.Raw):
        return raw_output(block, NAME)
    raise UpstreamProtocolError(f"the upstream answered with {type(block).__name__} content")


def message_item(identifier: str, content: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": identifier,
        "role": "assistant",
        "status": status,
        "content": content,
    }


def status_of(stop: internal.StopReason | None) -> tuple[str, dict[str, str] | None]:
    """(status, incomplete_details) for a stop reason."""
    if stop in ("max_tokens", "context_window_exceeded"):
        return "incomplete", {"reason": "max_output_tokens"}
    if stop == "refusal":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def response_object(
    response_id: str,
    model: str,
    created: int,
    request: internal.ChatRequest | None,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: internal.Usage | None = None,
    incomplete: dict[str, str] | None = None,
    error: dict[str, Any] | None = None,
) -> ResponseObject:
    """The whole ``response`` object, echoing the request's settings where known."""
    out: ResponseObject = {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": None,
        "max_output_tokens": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": None,
        "store": False,
        "temperature": None,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
        "truncation": "disabled",
        "usage": render_usage(usage) if usage is not None else None,
        "user": None,
        "metadata": {},
    }
    if request is not None:
        _echo(out, request)
    return out


def _echo(out: ResponseObject, request: internal.ChatRequest) -> None:
    if request.system:
        out["instructions"] = "\n\n".join(text.text for text in request.system)
    out["max_output_tokens"] = request.max_tokens
    if request.parallel_tool_calls is not None:
        out["parallel_tool_calls"] = request.parallel_tool_calls
    out["reasoning"] = render_reasoning(request)
    out["temperature"] = request.temperature
    out["top_p"] = request.top_p
    out["text"] = render_text(request) or out["text"]
    choice = request.tool_choice
    # Echo only what the Responses API itself can say; another format's own choice stays out.
    if choice is not None and (not isinstance(choice, internal.Raw) or choice.format == NAME):
        out["tool_choice"] = render_tool_choice(choice)
    out["tools"] = [
        render_tool(tool, request)
        for tool in request.tools
        if not isinstance(tool, internal.Raw) or tool.format == NAME
    ]
    out["user"] = request.user
    out["metadata"] = request.metadata or {}


def render_response(
    response: internal.ChatResponse, request: internal.ChatRequest | None = None
) -> ResponseObject:
    """A ``response`` body; pass the internal ``request`` to echo its settings."""
    status, incomplete = status_of(response.stop_reason)
    blocks = [
        block for block in response.content if not isinstance(block, internal.RedactedThinking)
    ]
    output = [output_item(block, response.id, i) for i, block in enumerate(blocks)]
    if status == "incomplete" and output and "status" in output[-1]:
        output[-1]["status"] = "incomplete"  # the item the cut went through
    created = response.created if response.created is not None else int(time.time())
    return response_object(
        response.id,
        response.model,
        created,
        request,
        status=status,
        output=output,
        usage=response.usage,
        incomplete=incomplete,
    )
