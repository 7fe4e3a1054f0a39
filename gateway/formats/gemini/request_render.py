"""Gemini ``generateContent`` requests for upstreams: the internal shape into a body.

The system prompt becomes ``systemInstruction``; turns become ``contents`` with roles ``user``
and ``model``; images go inline (``inlineData``) or by URI (``fileData``); tools are
``functionDeclarations`` with their JSON Schema as it is (``parametersJsonSchema``); a tool
result is a ``functionResponse`` named after the function of the call it answers (Gemini
names results by function, not by call id). Sampling goes into ``generationConfig``.

Gemini checks the reasoning proof (``thoughtSignature``) of the function calls it made: a
signature from an earlier Gemini answer is sent back on the part it came with; a function
call that has none (the conversation came from another provider) gets the placeholder
Google documents for such histories. The body carries ``model`` only for the provider, which
puts it in the URL and sends the rest.

Refused with a 400 naming the client's field: a system message after the first turn, several
choices, a ``parallel_tool_calls: false`` (Gemini has no such switch), images by file id, a
tool result with images, and anything the source format marked unportable.
"""

from __future__ import annotations

import mimetypes
from typing import Any

import orjson

from gateway.formats import internal, portability
from gateway.formats.errors import Untranslatable
from gateway.formats.fields import json_object_text
from gateway.formats.optional_fields import present

NAME = "gemini"
TARGET = portability.TITLES[NAME]
# What Google documents for a function call that no Gemini model signed (a history from
# another model): its thought-signature check is skipped.
UNSIGNED_CALL = "context_engineering_is_the_way_to_go"
_EFFORT_LEVELS = {
    "minimal": "minimal",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


def render_request(request: internal.ChatRequest, model: str) -> dict[str, Any]:
    """A generateContent body (``model`` beside it for the provider's URL); raises
    ``Untranslatable`` naming the client's field."""
    portability.check_unportable(request, NAME)
    portability.refuse_cache_warming(request, NAME)
    _refuse_unsupported(request)
    body: dict[str, Any] = {"model": model}
    if request.system:
        body["systemInstruction"] = {"parts": [{"text": text.text} for text in request.system]}
    names = _call_names(request)
    contents = [_render_message(message, names) for message in request.messages]
    body["contents"] = [content for content in contents if content["parts"]]
    if request.tools:
        body["tools"] = [{"functionDeclarations": [_render_tool(t) for t in request.tools]}]
        choice = _render_tool_choice(request)
        if choice is not None:
            body["toolConfig"] = {"functionCallingConfig": choice}
    config = present(
        {
            "maxOutputTokens": request.max_tokens,
            "temperature": request.temperature,
            "topP": request.top_p,
            "topK": request.top_k,
            "seed": request.seed,
            "presencePenalty": request.presence_penalty,
            "frequencyPenalty": request.frequency_penalty,
        }
    )
    if request.stop:
        config["stopSequences"] = list(request.stop)
    config.update(_render_response_format(request))
    thinking = _render_thinking(request)
    if thinking:
        config["thinkingConfig"] = thinking
    if config:
        body["generationConfig"] = config
    return body


def _refuse_unsupported(request: internal.ChatRequest) -> None:
    portability.refuse_unless(
        request, "n", NAME, request.n, 1, "the gateway relays one Gemini candidate per request"
    )
    if request.parallel_tool_calls is False:
        raise Untranslatable(
            request.field_name("parallel_tool_calls"),
            TARGET,
            "Gemini has no switch for parallel function calls",
        )
    spec = request.response_format
    if spec is not None and spec.kind == "json_schema" and spec.schema is None:
        raise Untranslatable(request.field_name("response_format"), TARGET, "the schema is missing")


def _call_names(request: internal.ChatRequest) -> dict[str, str]:
    """Each tool call's id -> its function's name, for the results that answer it."""
    return {
        block.id: block.name
        for message in request.messages
        for block in message.content
        if isinstance(block, internal.ToolCall)
    }


def _render_message(message: internal.Message, names: dict[str, str]) -> dict[str, Any]:
    if message.role == "system":
        raise Untranslatable(
            message.path or "messages",
            TARGET,
            "Gemini takes one system instruction, before the conversation",
        )
    role = "model" if message.role == "assistant" else "user"
    parts: list[dict[str, Any]] = []
    signature: str | None = None  # a Gemini proof, for the part that follows it
    signed = False
    for block in message.content:
        if isinstance(block, internal.Thinking):
            # Only Gemini's own proofs verify; reasoning from other providers is not resent.
            if block.origin == NAME and block.signature:
                signature = block.signature
            continue
        if isinstance(block, internal.RedactedThinking):
            continue
        part = _render_block(block, message, names)
        if signature is not None:
            part["thoughtSignature"], signature, signed = signature, None, True
        elif "functionCall" in part and not signed:
            part["thoughtSignature"], signed = UNSIGNED_CALL, True
        parts.append(part)
    if signature is not None:
        parts.append({"text": "", "thoughtSignature": signature})
    return {"role": role, "parts": parts}


def _render_block(
    block: internal.Block, message: internal.Message, names: dict[str, str]
) -> dict[str, Any]:
    if isinstance(block, internal.Text | internal.Refusal):
        return {"text": block.text}
    if isinstance(block, internal.Image):
        return _render_image(block)
    if isinstance(block, internal.ToolCall):
        arguments = json_object_text(block.arguments, block.path or message.path)
        return {"functionCall": {"name": block.name, "args": arguments}}
    if isinstance(block, internal.ToolResult):
        return _render_tool_result(block, names)
    return portability.raw_data(block, NAME, message.path)  # type: ignore[arg-type]


def _render_image(image: internal.Image) -> dict[str, Any]:
    where = image.path or "content"
    if image.file_id is not None:
        raise Untranslatable(where, TARGET, "images by file id stay with their provider")
    if image.data is not None:
        return {"inlineData": {"mimeType": image.media_type, "data": image.data}}
    assert image.url is not None
    media_type = mimetypes.guess_type(image.url.split("?", 1)[0])[0]
    if media_type is None or not media_type.startswith("image/"):
        raise Untranslatable(
            where, TARGET, "Gemini needs an image URL's type: send it inline, or a .png/.jpg URL"
        )
    return {"fileData": {"mimeType": media_type, "fileUri": image.url}}


def _render_tool_result(result: internal.ToolResult, names: dict[str, str]) -> dict[str, Any]:
    where = result.path or "content"
    name = names.get(result.call_id)
    if name is None:
        raise Untranslatable(
            where,
            TARGET,
            f"Gemini names a tool result by its function, and no call in the conversation "
            f"has id {result.call_id!r}",
        )
    texts: list[str] = []
    for block in result.content:
        if not isinstance(block, internal.Text):
            raise Untranslatable(block.path or where, TARGET, "Gemini tool results carry text")
        texts.append(block.text)
    text = "\n".join(texts)
    return {"functionResponse": {"name": name, "response": _response_object(text, result)}}


def _response_object(text: str, result: internal.ToolResult) -> dict[str, Any]:
    """A function's response is a JSON object at Gemini: a result that is one goes as it is,
    any other text under ``result`` (``error`` when the client marked it an error)."""
    if not result.is_error:
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            return value
    return {"error" if result.is_error else "result": text}


def _render_tool(tool: internal.Tool | internal.Raw) -> dict[str, Any]:
    if isinstance(tool, internal.Raw):
        return portability.raw_data(tool, NAME, "tools")
    declaration: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        declaration["description"] = tool.description
    if tool.parameters is not None:
        declaration["parametersJsonSchema"] = tool.parameters
    return declaration


def _render_tool_choice(request: internal.ChatRequest) -> dict[str, Any] | None:
    choice = request.tool_choice
    if choice is None:
        return None
    if isinstance(choice, internal.Raw):
        return portability.raw_data(choice, NAME, "tool_choice")
    modes = {"auto": "AUTO", "required": "ANY", "none": "NONE", "tool": "ANY"}
    config: dict[str, Any] = {"mode": modes[choice.mode]}
    if choice.mode == "tool":
        config["allowedFunctionNames"] = [choice.name]
    return config


def _render_response_format(request: internal.ChatRequest) -> dict[str, Any]:
    spec = request.response_format
    if spec is None or spec.kind == "text":
        return {}
    if spec.kind == "json_object":
        return {"responseMimeType": "application/json"}
    return {"responseMimeType": "application/json", "responseJsonSchema": spec.schema}


def _render_thinking(request: internal.ChatRequest) -> dict[str, Any]:
    reasoning = request.reasoning
    if reasoning is None:
        return {}
    if reasoning.mode == "disabled" or reasoning.effort == "none":
        return {"thinkingBudget": 0}
    config: dict[str, Any] = {}
    if reasoning.budget_tokens is not None:
        config["thinkingBudget"] = reasoning.budget_tokens
    elif reasoning.effort in _EFFORT_LEVELS:
        config["thinkingLevel"] = _EFFORT_LEVELS[reasoning.effort]
    if reasoning.summary is not None or reasoning.display not in (None, "omitted"):
        config["includeThoughts"] = True
    return config
