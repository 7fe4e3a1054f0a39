"""Anthropic Messages requests for upstreams: the internal shape into a body.

Rendering fills what Anthropic requires and other formats leave out: a ``max_tokens``
(``default_max_tokens`` when the client gave none) and tool inputs as JSON objects. It refuses
what Anthropic cannot do (several choices, penalties, JSON mode without a schema, temperature
above 1) and drops what is harmless to lose (seed, metadata, image detail). Only thinking that
Anthropic signed is resent.
"""

from __future__ import annotations

from typing import Any

from gateway.formats import internal, portability
from gateway.formats.errors import Untranslatable
from gateway.formats.fields import json_object_text
from gateway.formats.media import ANTHROPIC_IMAGE_TYPES
from gateway.formats.optional_fields import present
from gateway.formats.parts import ContentParts

NAME = "anthropic_messages"
TARGET = portability.TITLES[NAME]
DEFAULT_MAX_TOKENS = 4096


def render_request(
    request: internal.ChatRequest, model: str, *, default_max_tokens: int = DEFAULT_MAX_TOKENS
) -> dict[str, Any]:
    """A Messages body for ``model``; raises ``Untranslatable`` naming the client's field."""
    check_portable(request)
    max_tokens = request.max_tokens if request.max_tokens is not None else default_max_tokens
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens}
    if request.system:
        body["system"] = _render_texts(request.system)
    messages = [_render_message(message) for message in request.messages]
    # A turn left empty (only reasoning from another provider) is dropped: Anthropic joins
    # the consecutive turns of one role that this may leave.
    body["messages"] = [message for message in messages if message["content"]]
    if request.tools:
        body["tools"] = [_render_tool(tool, request) for tool in request.tools]
        choice = _render_tool_choice(request)
        if choice is not None:
            body["tool_choice"] = choice
    optional = {"temperature": request.temperature, "top_p": request.top_p, "top_k": request.top_k}
    body.update(present(optional))
    if request.stop:
        body["stop_sequences"] = list(request.stop)
    if request.user is not None:
        body["metadata"] = {"user_id": request.user}
    _render_reasoning(body, request)
    if request.cache_control is not None:
        body["cache_control"] = request.cache_control
    if request.stream:
        body["stream"] = True
    portability.merge_extras(body, request, NAME)
    return body


def check_portable(request: internal.ChatRequest) -> None:
    """What of ``request`` a Messages body cannot carry, refused by name (``Untranslatable``)."""
    portability.check_unportable(request, NAME)
    portability.refuse_unless(
        request, "n", NAME, request.n, 1, "Anthropic returns one answer per request"
    )
    for name in ("presence_penalty", "frequency_penalty"):
        portability.refuse_unless(
            request, name, NAME, getattr(request, name), 0, "Anthropic has no penalties"
        )
    if request.temperature is not None and request.temperature > 1:
        raise Untranslatable(request.field_name("temperature"), TARGET, "Anthropic accepts 0 to 1")
    spec = request.response_format
    if spec is not None and spec.kind == "json_object":
        raise Untranslatable(
            request.field_name("response_format"), TARGET, "JSON mode needs a schema at Anthropic"
        )
    if spec is not None and spec.kind == "json_schema" and spec.schema is None:
        raise Untranslatable(request.field_name("response_format"), TARGET, "the schema is missing")


def _render_texts(texts: list[internal.Text]) -> str | list[dict[str, Any]]:
    if len(texts) == 1 and texts[0].cache_control is None:
        return texts[0].text
    return [_render_text(text) for text in texts]


def _render_text(text: internal.Text) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "text", "text": text.text}
    if text.cache_control is not None:
        out["cache_control"] = text.cache_control
    return out


def _render_message(message: internal.Message) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = []
    for block in message.content:
        rendered = _render_block(block, message)
        if rendered is not None:
            blocks.append(rendered)
    return {"role": message.role, "content": blocks}


def _render_block(block: internal.Block, message: internal.Message) -> dict[str, Any] | None:
    if isinstance(block, internal.Text):
        return _render_text(block)
    if isinstance(block, internal.Refusal):
        return {"type": "text", "text": block.text}
    if isinstance(block, internal.Image):
        return _render_image(block)
    if isinstance(block, internal.ToolCall):
        out = {
            "type": "tool_use",
            "id": block.id,
            "name": block.name,
            "input": json_object_text(block.arguments, block.path or message.path),
        }
        return _with_cache(out, block.cache_control)
    if isinstance(block, internal.ToolResult):
        return _render_tool_result(block)
    if isinstance(block, internal.Thinking):
        # Only Anthropic's own signatures verify; reasoning from other providers is not resent.
        if not block.signature or block.origin != NAME:
            return None
        return {"type": "thinking", "thinking": block.text, "signature": block.signature}
    if isinstance(block, internal.RedactedThinking):
        return {"type": "redacted_thinking", "data": block.data}
    return portability.raw_data(block, NAME, message.path)


def _with_cache(out: dict[str, Any], cache: dict[str, Any] | None) -> dict[str, Any]:
    if cache is not None:
        out["cache_control"] = cache
    return out


def _render_image(image: internal.Image) -> dict[str, Any]:
    if image.file_id is not None:
        if image.origin != NAME:
            raise Untranslatable(
                image.path or "content", TARGET, "images by file id stay with their provider"
            )
        source: dict[str, Any] = {"type": "file", "file_id": image.file_id}
    elif image.data is not None:
        if image.media_type not in ANTHROPIC_IMAGE_TYPES:
            raise Untranslatable(
                image.path or "content",
                TARGET,
                f"Anthropic takes only {', '.join(ANTHROPIC_IMAGE_TYPES)}",
            )
        source = {"type": "base64", "media_type": image.media_type, "data": image.data}
    else:
        source = {"type": "url", "url": image.url}
    return _with_cache({"type": "image", "source": source}, image.cache_control)


_PARTS = ContentParts(NAME, _render_text, _render_image)


def _render_tool_result(result: internal.ToolResult) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "tool_result", "tool_use_id": result.call_id}
    content = [
        _PARTS.render(block, result.path, "tool results carry text and images")
        for block in result.content
    ]
    if len(content) == 1 and content[0]["type"] == "text" and "cache_control" not in content[0]:
        out["content"] = content[0]["text"]
    elif content:
        out["content"] = content
    if result.is_error:
        out["is_error"] = True
    return _with_cache(out, result.cache_control)


def _render_tool(
    tool: internal.Tool | internal.Raw, request: internal.ChatRequest
) -> dict[str, Any]:
    if isinstance(tool, internal.Raw):
        return portability.raw_data(tool, NAME, "tools")
    out: dict[str, Any] = {
        "name": tool.name,
        "input_schema": tool.parameters or {"type": "object", "properties": {}},
        **present({"description": tool.description, "strict": tool.strict}),
    }
    if request.same_format(NAME):
        out.update(tool.extras)
    return _with_cache(out, tool.cache_control)


def _render_tool_choice(request: internal.ChatRequest) -> dict[str, Any] | None:
    choice = request.tool_choice
    if isinstance(choice, internal.Raw):
        return portability.raw_data(choice, NAME, "tool_choice")
    out: dict[str, Any] | None = None
    if choice is not None:
        kinds = {"auto": "auto", "required": "any", "none": "none", "tool": "tool"}
        out = {"type": kinds[choice.mode]}
        if choice.mode == "tool":
            out["name"] = choice.name
    if request.parallel_tool_calls is False and (out is None or out["type"] != "none"):
        out = out or {"type": "auto"}
        out["disable_parallel_tool_use"] = True
    return out


def _render_reasoning(body: dict[str, Any], request: internal.ChatRequest) -> None:
    reasoning = request.reasoning
    config: dict[str, Any] = {}
    if request.response_format is not None and request.response_format.kind == "json_schema":
        config["format"] = {"type": "json_schema", "schema": request.response_format.schema}
    if reasoning is not None:
        if reasoning.mode is not None:
            thinking: dict[str, Any] = {"type": reasoning.mode}
            if reasoning.budget_tokens is not None:
                thinking["budget_tokens"] = reasoning.budget_tokens
            if reasoning.display is not None:
                thinking["display"] = reasoning.display
            body["thinking"] = thinking
        elif reasoning.effort == "none":
            body["thinking"] = {"type": "disabled"}
        effort = {"minimal": "low", "none": None}.get(reasoning.effort or "", reasoning.effort)
        if effort is not None:
            config["effort"] = effort
    if config:
        body["output_config"] = config
