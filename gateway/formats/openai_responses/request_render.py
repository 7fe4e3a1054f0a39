"""Responses API requests for upstreams: the internal shape into a body, always ``store: false``.

Function tools whose ``strict`` the client left unset go with ``strict: false`` (the Responses
default is true, every other format's is false). Reasoning items are resent only when they came
from a Responses upstream (they carry its id and encrypted content). Stop sequences, top_k,
penalties and several choices have no place here and are refused.
"""

from __future__ import annotations

import functools
from typing import Any

from gateway.formats import internal, portability
from gateway.formats.errors import Untranslatable
from gateway.formats.media import data_url
from gateway.formats.openai_tools import put_tools
from gateway.formats.optional_fields import present
from gateway.formats.parts import ContentParts

NAME = "openai_responses"
TARGET = portability.TITLES[NAME]


def render_request(request: internal.ChatRequest, model: str) -> dict[str, Any]:
    """A Responses body for ``model`` (always ``store: false``); raises ``Untranslatable``."""
    check_portable(request)
    body: dict[str, Any] = {"model": model}
    items: list[dict[str, Any]] = []
    if len(request.system) == 1:
        body["instructions"] = request.system[0].text
    elif request.system:
        items.append(_system_item(request.system))
    for message in request.messages:
        items.extend(_render_message(message))
    body["input"] = items
    put_tools(body, request, functools.partial(render_tool, request=request), render_tool_choice)
    optional = {
        "max_output_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "user": request.user,
        "metadata": request.metadata,
    }
    body.update(present(optional))
    text = render_text(request)
    if text is not None:
        body["text"] = text
    reasoning = render_reasoning(request)
    if reasoning is not None:
        body["reasoning"] = reasoning
    if request.stream:
        body["stream"] = True
    body["store"] = False
    if request.same_format(NAME) and "text" in request.extras:
        body["text"] = {**request.extras["text"], **body.get("text", {})}
    portability.merge_extras(body, request, NAME)
    return body


def check_portable(request: internal.ChatRequest) -> None:
    """What of ``request`` a Responses body cannot carry, refused by name (``Untranslatable``)."""
    portability.check_unportable(request, NAME)
    portability.refuse_unless(
        request, "n", NAME, request.n, 1, "the Responses API returns one answer"
    )
    portability.refuse_unless(
        request, "top_k", NAME, request.top_k, None, "the Responses API has no top_k"
    )
    portability.refuse_unless(
        request, "stop", NAME, request.stop, [], "the Responses API has no stop sequences"
    )
    portability.refuse_cache_warming(request, NAME)
    for name in ("presence_penalty", "frequency_penalty"):
        portability.refuse_unless(
            request, name, NAME, getattr(request, name), 0, "the Responses API has no penalties"
        )


def _system_item(texts: list[internal.Text]) -> dict[str, Any]:
    content = [{"type": "input_text", "text": text.text} for text in texts]
    return {"type": "message", "role": "system", "content": content}


def _render_message(message: internal.Message) -> list[dict[str, Any]]:
    if message.role == "system":
        texts = []
        for block in message.content:
            if not isinstance(block, internal.Text):
                raise Untranslatable(
                    block.path or message.path, TARGET, "system messages carry only text"
                )
            texts.append(block)
        return [_system_item(texts)]
    if message.role == "assistant":
        return _render_assistant(message)
    items, parts = _PARTS.split_user(
        message, _render_tool_result, lambda block: "user messages cannot carry this"
    )
    if parts:
        items.append({"type": "message", "role": "user", "content": parts})
    return items


def _render_assistant(message: internal.Message) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            items.append({"type": "message", "role": "assistant", "content": "".join(texts)})
            texts.clear()

    for block in message.content:
        if isinstance(block, internal.Text | internal.Refusal):
            texts.append(block.text)
            continue
        flush()
        if isinstance(block, internal.ToolCall):
            items.append(
                {
                    "type": "function_call",
                    "call_id": block.id,
                    "name": block.name,
                    "arguments": block.arguments,
                }
            )
        elif isinstance(block, internal.Thinking):
            # Only reasoning items OpenAI produced can be resent; other providers' is dropped.
            if block.origin == NAME and block.item_id:
                items.append(render_reasoning_item(block, block.item_id))
        elif isinstance(block, internal.Raw):
            items.append(portability.raw_data(block, NAME, message.path))
        elif isinstance(block, internal.ToolResult | internal.Image):
            raise Untranslatable(
                block.path or message.path, TARGET, "assistant turns cannot carry this"
            )
    flush()
    return items


def render_reasoning_item(block: internal.Thinking, item_id: str) -> dict[str, Any]:
    item: dict[str, Any] = {
        "type": "reasoning",
        "id": item_id,
        "summary": [{"type": "summary_text", "text": block.text}] if block.text else [],
    }
    if block.signature:
        item["encrypted_content"] = block.signature
    return item


def _render_tool_result(result: internal.ToolResult) -> dict[str, Any]:
    """``is_error`` has no field here: the output goes as it is (documented)."""
    parts = [
        _PARTS.render(block, result.path, "tool outputs carry text and images")
        for block in result.content
    ]
    output: str | list[dict[str, Any]] = parts
    if not parts:
        output = ""
    elif len(parts) == 1 and parts[0]["type"] == "input_text":
        output = parts[0]["text"]
    return {"type": "function_call_output", "call_id": result.call_id, "output": output}


def _render_image(image: internal.Image) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "input_image", "detail": image.detail or "auto"}
    if image.file_id is not None:
        if image.origin != NAME:
            raise Untranslatable(
                image.path or "content", TARGET, "images by file id stay with their provider"
            )
        part["file_id"] = image.file_id
    elif image.data is not None and image.media_type is not None:
        part["image_url"] = data_url(image.media_type, image.data)
    else:
        part["image_url"] = image.url
    return part


def _input_text(text: internal.Text) -> dict[str, Any]:
    return {"type": "input_text", "text": text.text}


# Raw items stand alone in the input, but for files (parts of a message).
_PARTS = ContentParts(
    NAME, _input_text, _render_image, lambda data: data.get("type") != "input_file"
)


def render_tool(
    tool: internal.Tool | internal.Raw, request: internal.ChatRequest | None
) -> dict[str, Any]:
    if isinstance(tool, internal.Raw):
        return portability.raw_data(tool, NAME, "tools")
    out: dict[str, Any] = {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
        "strict": tool.strict if tool.strict is not None else False,
    }
    if request is not None and request.same_format(NAME):
        out.update(tool.extras)
    return out


def render_tool_choice(choice: internal.ToolChoice | internal.Raw) -> Any:
    if isinstance(choice, internal.Raw):
        return portability.raw_data(choice, NAME, "tool_choice")
    if choice.mode == "tool":
        return {"type": "function", "name": choice.name}
    return choice.mode


def render_format(spec: internal.ResponseFormat) -> dict[str, Any]:
    if spec.kind != "json_schema":
        return {"type": spec.kind}
    return {
        "type": "json_schema",
        "name": spec.name or "response",
        "schema": spec.schema,
        **present({"description": spec.description, "strict": spec.strict}),
    }


def render_text(request: internal.ChatRequest) -> dict[str, Any] | None:
    if request.response_format is None:
        return None
    return {"format": render_format(request.response_format)}


def render_reasoning(request: internal.ChatRequest) -> dict[str, Any] | None:
    """Effort and summary; Anthropic's thinking budget has no equivalent and is dropped."""
    reasoning = request.reasoning
    if reasoning is None or (reasoning.effort is None and reasoning.summary is None):
        return None
    return present({"effort": reasoning.effort, "summary": reasoning.summary})
