"""Bedrock ``Converse`` requests for upstreams: the internal shape into a body.

One format for every model on Bedrock (Anthropic's, Meta's Llama, Mistral, Amazon Nova ...):
``system`` text blocks, ``messages`` of content blocks (``text``, ``image`` with its bytes
base64, ``toolUse``, ``toolResult``, ``reasoningContent``), ``inferenceConfig`` for the
sampling Bedrock knows and ``toolConfig`` for tools (``toolSpec`` with the JSON Schema as it
is). A prompt-cache marker (``cache_control``) becomes a ``cachePoint`` after the block it
marks, which is what Bedrock's prompt caching reads. The body carries ``model`` only for the
provider, which puts it in the URL and sends the rest.

Refused with a 400 naming the client's field: several choices, penalties, a seed, JSON mode
or a response schema (Converse has no structured output), ``parallel_tool_calls: false``,
``tool_choice: none``, images by URL or file id (Bedrock takes image bytes), and anything the
source format marked unportable. ``top_k`` goes in ``additionalModelRequestFields``, where
the models that have it read it.
"""

from __future__ import annotations

from typing import Any

from gateway.formats import internal, portability
from gateway.formats.errors import Untranslatable
from gateway.formats.fields import json_object_text
from gateway.formats.optional_fields import present

NAME = "bedrock_converse"
TARGET = portability.TITLES[NAME]
# Converse's image formats, by media type.
IMAGE_FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/gif": "gif", "image/webp": "webp"}
CACHE_POINT = {"cachePoint": {"type": "default"}}


def render_request(request: internal.ChatRequest, model: str) -> dict[str, Any]:
    """A Converse body (``model`` beside it for the provider's URL); raises
    ``Untranslatable`` naming the client's field."""
    portability.check_unportable(request, NAME)
    portability.refuse_cache_warming(request, NAME)
    _refuse_unsupported(request)
    body: dict[str, Any] = {"model": model}
    if request.system:
        body["system"] = _with_cache_points(request.system, lambda text: {"text": text.text})
    messages = [_render_message(message) for message in request.messages]
    body["messages"] = [message for message in messages if message["content"]]
    config = present(
        {"maxTokens": request.max_tokens, "temperature": request.temperature, "topP": request.top_p}
    )
    if request.stop:
        config["stopSequences"] = list(request.stop)
    if config:
        body["inferenceConfig"] = config
    if request.tools:
        tool_config: dict[str, Any] = {"tools": [_render_tool(tool) for tool in request.tools]}
        choice = _render_tool_choice(request)
        if choice is not None:
            tool_config["toolChoice"] = choice
        body["toolConfig"] = tool_config
    extra: dict[str, Any] = {}
    if request.top_k is not None:
        extra["top_k"] = request.top_k
    thinking = _render_thinking(request)
    if thinking is not None:
        extra["thinking"] = thinking
    if extra:
        body["additionalModelRequestFields"] = extra
    return body


def _refuse_unsupported(request: internal.ChatRequest) -> None:
    portability.refuse_unless(
        request, "n", NAME, request.n, 1, "Converse returns one answer per request"
    )
    for name in ("presence_penalty", "frequency_penalty"):
        portability.refuse_unless(
            request, name, NAME, getattr(request, name), 0, "Converse has no penalties"
        )
    if request.seed is not None:
        raise Untranslatable(request.field_name("seed"), TARGET, "Converse has no seed")
    spec = request.response_format
    if spec is not None and spec.kind != "text":
        raise Untranslatable(
            request.field_name("response_format"), TARGET, "Converse has no structured output"
        )
    if request.parallel_tool_calls is False:
        raise Untranslatable(
            request.field_name("parallel_tool_calls"),
            TARGET,
            "Converse has no switch for parallel tool calls",
        )
    reasoning = request.reasoning
    if reasoning is not None and reasoning.mode is None and reasoning.effort not in (None, "none"):
        raise Untranslatable(
            request.field_name("reasoning"), TARGET, "Converse sets thinking by a token budget"
        )
    choice = request.tool_choice
    if isinstance(choice, internal.ToolChoice) and choice.mode == "none" and request.tools:
        raise Untranslatable("tool_choice", TARGET, "Converse cannot offer tools and forbid them")


def _with_cache_points(blocks: list[Any], render: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in blocks:
        out.append(render(block))
        if getattr(block, "cache_control", None) is not None:
            out.append(dict(CACHE_POINT))
    return out


def _render_message(message: internal.Message) -> dict[str, Any]:
    if message.role == "system":
        raise Untranslatable(
            message.path or "messages",
            TARGET,
            "Converse takes its system prompt before the conversation",
        )
    content: list[dict[str, Any]] = []
    for block in message.content:
        rendered = _render_block(block, message)
        if rendered is None:
            continue
        content.append(rendered)
        if getattr(block, "cache_control", None) is not None:
            content.append(dict(CACHE_POINT))
    return {"role": message.role, "content": content}


def _render_block(block: internal.Block, message: internal.Message) -> dict[str, Any] | None:
    if isinstance(block, internal.Text | internal.Refusal):
        return {"text": block.text}
    if isinstance(block, internal.Image):
        return {"image": _render_image(block)}
    if isinstance(block, internal.ToolCall):
        arguments = json_object_text(block.arguments, block.path or message.path)
        return {"toolUse": {"toolUseId": block.id, "name": block.name, "input": arguments}}
    if isinstance(block, internal.ToolResult):
        return {"toolResult": _render_tool_result(block)}
    if isinstance(block, internal.Thinking):
        # Only Bedrock's own signatures verify; reasoning from other providers is not resent.
        if not block.signature or block.origin != NAME:
            return None
        text = {"text": block.text, "signature": block.signature}
        return {"reasoningContent": {"reasoningText": text}}
    if isinstance(block, internal.RedactedThinking):
        return {"reasoningContent": {"redactedContent": block.data}}
    return portability.raw_data(block, NAME, message.path)


def _render_image(image: internal.Image) -> dict[str, Any]:
    where = image.path or "content"
    if image.data is None:
        raise Untranslatable(where, TARGET, "Bedrock takes images as their bytes (base64)")
    image_format = IMAGE_FORMATS.get(image.media_type or "")
    if image_format is None:
        raise Untranslatable(where, TARGET, f"Bedrock takes only {', '.join(IMAGE_FORMATS)}")
    return {"format": image_format, "source": {"bytes": image.data}}


def _render_tool_result(result: internal.ToolResult) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for block in result.content:
        if isinstance(block, internal.Text):
            content.append({"text": block.text})
        elif isinstance(block, internal.Image):
            content.append({"image": _render_image(block)})
        else:
            where = block.path or result.path or "content"
            raise Untranslatable(where, TARGET, "tool results carry text and images")
    out: dict[str, Any] = {"toolUseId": result.call_id, "content": content or [{"text": ""}]}
    if result.is_error:
        out["status"] = "error"
    return out


def _render_tool(tool: internal.Tool | internal.Raw) -> dict[str, Any]:
    if isinstance(tool, internal.Raw):
        return portability.raw_data(tool, NAME, "tools")
    schema = tool.parameters or {"type": "object", "properties": {}}
    spec: dict[str, Any] = {"name": tool.name, "inputSchema": {"json": schema}}
    if tool.description is not None:
        spec["description"] = tool.description
    return {"toolSpec": spec}


def _render_tool_choice(request: internal.ChatRequest) -> dict[str, Any] | None:
    choice = request.tool_choice
    if choice is None:
        return None
    if isinstance(choice, internal.Raw):
        return portability.raw_data(choice, NAME, "tool_choice")
    if choice.mode == "required":
        return {"any": {}}
    if choice.mode == "tool":
        return {"tool": {"name": choice.name}}
    return {"auto": {}}  # auto; none without tools offers nothing to forbid


def _render_thinking(request: internal.ChatRequest) -> dict[str, Any] | None:
    """Extended thinking, for the models that have it (Anthropic's on Bedrock read it from
    ``additionalModelRequestFields``)."""
    reasoning = request.reasoning
    if reasoning is None or reasoning.mode is None:
        return None
    thinking: dict[str, Any] = {"type": reasoning.mode}
    if reasoning.budget_tokens is not None:
        thinking["budget_tokens"] = reasoning.budget_tokens
    return thinking
