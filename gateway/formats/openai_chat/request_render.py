"""Chat Completions requests for upstreams: the internal shape into a body.

Tool results are written back as ``tool`` messages ahead of the rest of their turn; the token
limit goes as ``max_completion_tokens``; a stream always asks for usage (the gateway meters from
it). Reasoning goes as ``reasoning_effort`` only: Anthropic's thinking budget has no equivalent.
Thinking blocks are not resent, ``is_error`` of tool results and ``cache_control`` hints are
dropped (docs/formats.md lists every rule).
"""

from __future__ import annotations

from typing import Any

from gateway.formats import internal, portability
from gateway.formats.errors import Untranslatable
from gateway.formats.media import data_url
from gateway.formats.openai_chat.response import render_tool_call, texts_of
from gateway.formats.openai_tools import put_tools
from gateway.formats.optional_fields import present
from gateway.formats.parts import ContentParts

NAME = "openai_chat"
TARGET = portability.TITLES[NAME]


def render_request(request: internal.ChatRequest, model: str) -> dict[str, Any]:
    """A Chat Completions body for ``model``; raises ``Untranslatable`` naming the client's field."""
    check_portable(request)
    body: dict[str, Any] = {"model": model, "messages": _render_messages(request)}
    put_tools(body, request, _render_tool, _render_tool_choice)
    optional = {
        "max_completion_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "n": request.n,
        "seed": request.seed,
        "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty,
        "user": request.user,
        "metadata": request.metadata,
    }
    body.update(present(optional))
    if request.stop:
        body["stop"] = list(request.stop)
    if request.response_format is not None:
        body["response_format"] = _render_response_format(request.response_format)
    effort = _effort(request.reasoning)
    if effort is not None:
        body["reasoning_effort"] = effort
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    portability.merge_extras(body, request, NAME)
    return body


def check_portable(request: internal.ChatRequest) -> None:
    """What of ``request`` a Chat Completions body cannot carry, refused by name
    (``Untranslatable``)."""
    portability.check_unportable(request, NAME)
    portability.refuse_unless(
        request, "top_k", NAME, request.top_k, None, "Chat Completions has no top_k"
    )
    portability.refuse_cache_warming(request, NAME)


def _effort(reasoning: internal.Reasoning | None) -> str | None:
    """OpenAI takes an effort only: Anthropic's budget and thinking mode have no equivalent."""
    if reasoning is None:
        return None
    return reasoning.effort


def _render_messages(request: internal.ChatRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": _text_content(request.system)})
    for message in request.messages:
        if message.role == "system":
            texts = [_system_text(block) for block in message.content]
            messages.append({"role": "system", "content": _text_content(texts)})
        elif message.role == "assistant":
            messages.append(_render_assistant(message))
        else:
            messages.extend(_render_user(message))
    return messages


def _system_text(block: internal.Block) -> internal.Text:
    if not isinstance(block, internal.Text):
        raise Untranslatable(block.path or "system", TARGET, "system messages carry only text")
    return block


def _text_content(texts: list[internal.Text]) -> str | list[dict[str, Any]]:
    if len(texts) == 1:
        return texts[0].text
    return [{"type": "text", "text": text.text} for text in texts]


def _render_user(message: internal.Message) -> list[dict[str, Any]]:
    out, parts = _PARTS.split_user(
        message, _render_tool_result, lambda block: f"user messages cannot carry {_kind(block)}"
    )
    if parts:
        only_text = len(parts) == 1 and parts[0]["type"] == "text"
        out.append({"role": "user", "content": parts[0]["text"] if only_text else parts})
    return out


def _render_tool_result(result: internal.ToolResult) -> dict[str, Any]:
    """``is_error`` has no field here: the result's text goes as it is (documented)."""
    texts: list[internal.Text] = []
    for block in result.content:
        if not isinstance(block, internal.Text):
            raise Untranslatable(
                block.path or result.path, TARGET, "tool results carry only text there"
            )
        texts.append(block)
    content = _text_content(texts) if texts else ""
    return {"role": "tool", "tool_call_id": result.call_id, "content": content}


def _render_image(image: internal.Image) -> dict[str, Any]:
    if image.url is not None:
        url = image.url
    elif image.data is not None and image.media_type is not None:
        url = data_url(image.media_type, image.data)
    else:
        raise Untranslatable(
            image.path or "content", TARGET, "images by file id stay with their provider"
        )
    return {"type": "image_url", "image_url": {"url": url, **present({"detail": image.detail})}}


def _text_part(text: internal.Text) -> dict[str, Any]:
    return {"type": "text", "text": text.text}


# A legacy function message stands alone; other raw parts join the user message.
_PARTS = ContentParts(NAME, _text_part, _render_image, lambda data: data.get("role") == "function")


def _render_assistant(message: internal.Message) -> dict[str, Any]:
    calls: list[dict[str, Any]] = []
    out: dict[str, Any] = {"role": "assistant"}
    for block in message.content:
        if isinstance(block, internal.ToolCall):
            calls.append(render_tool_call(block))
        elif isinstance(block, internal.Raw):
            data = portability.raw_data(block, NAME, message.path)
            if "type" in data:
                calls.append(data)  # a custom tool call
            else:
                out.update(data)  # legacy function_call, audio reference
        elif isinstance(block, internal.ToolResult | internal.Image):
            raise Untranslatable(
                block.path or message.path,
                TARGET,
                f"assistant messages cannot carry {_kind(block)}",
            )
        # Thinking is not sent back: Chat Completions has no field for it (documented).
    texts = texts_of(message.content, internal.Text)
    refusals = texts_of(message.content, internal.Refusal)
    out["content"] = "".join(texts) if texts or not calls else None
    if refusals:
        out["refusal"] = "".join(refusals)
    if calls:
        out["tool_calls"] = calls
    return out


def _render_tool(tool: internal.Tool | internal.Raw) -> dict[str, Any]:
    if isinstance(tool, internal.Raw):
        return portability.raw_data(tool, NAME, "tools")
    function = present(
        {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
            "strict": tool.strict,
        }
    )
    return {"type": "function", "function": function}


def _render_tool_choice(choice: internal.ToolChoice | internal.Raw) -> Any:
    if isinstance(choice, internal.Raw):
        return portability.raw_data(choice, NAME, "tool_choice")
    if choice.mode == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return choice.mode


def _render_response_format(spec: internal.ResponseFormat) -> dict[str, Any]:
    if spec.kind != "json_schema":
        return {"type": spec.kind}
    schema = present(
        {
            "name": spec.name or "response",
            "description": spec.description,
            "schema": spec.schema,
            "strict": spec.strict,
        }
    )
    return {"type": "json_schema", "json_schema": schema}


def _kind(block: internal.Block) -> str:
    return {
        "ToolResult": "tool results",
        "Image": "images",
        "Thinking": "thinking",
        "RedactedThinking": "redacted thinking",
        "Refusal": "refusals",
        "ToolCall": "tool calls",
    }.get(type(block).__name__, "this content")
