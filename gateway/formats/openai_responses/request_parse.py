"""Responses API requests from clients, stateless: a body into the internal shape.

The gateway keeps nothing between requests, so ``previous_response_id``, ``conversation``,
``item_reference`` items, ``background`` and an explicit ``store: true`` are refused with a 400
that says why; the client sends the whole conversation in ``input`` (``store: false``
semantics). ``instructions`` and leading system/developer items become the system prompt. The
flat item list is grouped into turns: assistant-side items (messages, ``function_call``,
``reasoning``) into one assistant turn, consecutive ``function_call_output`` items into one user
turn of tool results.
"""

from __future__ import annotations

from typing import Any

from gateway.formats import fields, internal
from gateway.formats.errors import MalformedRequest
from gateway.formats.media import image_from_url
from gateway.formats.openai_tools import function_fields, tool_choice_mode
from gateway.formats.signatures import from_client

NAME = "openai_responses"
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
SUMMARIES = ("auto", "concise", "detailed")
STATELESS = "the gateway keeps no state between requests; send the whole conversation in input"
_MODELLED = frozenset(
    {
        "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
        "max_output_tokens", "temperature", "top_p", "text", "reasoning", "user", "metadata",
        "stream", "store",
    }
)  # fmt: skip


def parse_request(body: bytes | str | dict[str, Any]) -> internal.ChatRequest:
    data = fields.load_object(body)
    _refuse_stateful(data)
    model = fields.required_str(data, "model", "model", non_empty=True)
    request = internal.ChatRequest(model=model, source=NAME, messages=[])
    instructions = fields.opt_str(data, "instructions", "instructions")
    if instructions:
        request.system.append(internal.Text(instructions, path="instructions"))
    _parse_input(request, fields.required(data, "input", "input"))
    tools = fields.opt_array(data, "tools", "tools")
    request.tools = [_parse_tool(tool, fields.at("tools", i)) for i, tool in enumerate(tools)]
    request.tool_choice = _parse_tool_choice(data.get("tool_choice"))
    request.parallel_tool_calls = fields.opt_bool(
        data, "parallel_tool_calls", "parallel_tool_calls"
    )
    request.max_tokens = fields.opt_int(data, "max_output_tokens", "max_output_tokens", 1, 10**9)
    request.temperature = fields.opt_number(data, "temperature", "temperature", 0, 2)
    request.top_p = fields.opt_number(data, "top_p", "top_p", 0, 1)
    request.response_format = _parse_text(data)
    request.reasoning = _parse_reasoning(data)
    request.user = fields.opt_str(data, "user", "user")
    if data.get("metadata") is not None:
        request.metadata = fields.string_map(data["metadata"], "metadata")
    request.stream = bool(fields.opt_bool(data, "stream", "stream"))
    request.extras = {key: value for key, value in data.items() if key not in _MODELLED}
    text_rest = {key: value for key, value in (data.get("text") or {}).items() if key != "format"}
    if text_rest:
        request.extras["text"] = text_rest  # verbosity: for the same format only
    if data.get("top_logprobs"):
        request.unportable["top_logprobs"] = "token log-probabilities"
    include = data.get("include") or []
    if "message.output_text.logprobs" in include:
        request.unportable["include"] = "token log-probabilities"
    if data.get("prompt") is not None:
        request.unportable["prompt"] = "prompt templates are stored at OpenAI"
    if data.get("context_management") is not None:
        request.unportable["context_management"] = "OpenAI's server-side compaction"
    return request


def _refuse_stateful(data: dict[str, Any]) -> None:
    for name in ("previous_response_id", "conversation"):
        if data.get(name) is not None:
            raise MalformedRequest(f"{name} is not supported: {STATELESS}", param=name)
    if data.get("background") is True:
        raise MalformedRequest(f"background is not supported: {STATELESS}", param="background")
    if data.get("store") is True:
        raise MalformedRequest(
            f"store: true is not supported: {STATELESS}; omit store or set it to false",
            param="store",
        )
    fields.opt_bool(data, "store", "store")


def _parse_input(request: internal.ChatRequest, value: Any) -> None:
    if isinstance(value, str):
        request.messages.append(
            internal.Message("user", [internal.Text(value, path="input")], "input")
        )
        return
    for item, path in fields.objects(value, "input"):
        kind = item.get("type", "message")
        if kind == "message":
            _parse_message_item(request, item, path)
        elif kind == "function_call":
            _add(request, "assistant", _parse_function_call(item, path), path)
        elif kind == "function_call_output":
            _add(request, "user", _parse_function_output(item, path), path)
        elif kind == "reasoning":
            _add(request, "assistant", _parse_reasoning_item(item, path), path)
        elif kind == "item_reference":
            raise MalformedRequest(
                f"item_reference items are not supported: {STATELESS}", param=path
            )
        elif isinstance(kind, str):
            role: internal.Role = "user" if kind.endswith("_output") else "assistant"
            _add(request, role, internal.Raw(NAME, item, path), path)
        else:
            raise MalformedRequest(f"{path}.type must be a string", param=fields.at(path, "type"))


def _add(
    request: internal.ChatRequest, role: internal.Role, block: internal.Block, path: str
) -> None:
    """Appends to the last turn when it is the same side; tool results join only each other."""
    last = request.messages[-1] if request.messages else None
    if last is not None and last.role == role:
        joins = role == "assistant" or (
            isinstance(block, internal.ToolResult)
            and all(isinstance(item, internal.ToolResult) for item in last.content)
        )
        if joins:
            last.content.append(block)
            return
    request.messages.append(internal.Message(role, [block], path))


def _parse_message_item(request: internal.ChatRequest, item: dict[str, Any], path: str) -> None:
    role = item.get("role")
    content_path = fields.at(path, "content")
    content = fields.required(item, "content", content_path)
    if role not in ("user", "assistant", "system", "developer"):
        raise MalformedRequest(
            f"{path}.role must be user, assistant, system or developer",
            param=fields.at(path, "role"),
        )
    if isinstance(content, str):
        blocks: list[internal.Block] = [internal.Text(content, path=content_path)]
    else:
        blocks = [
            _parse_part(part, part_path)
            for part, part_path in fields.objects(content, content_path)
        ]
    if role in ("system", "developer"):
        texts = [_system_text(block) for block in blocks]
        if request.messages:
            request.messages.append(internal.Message("system", list(texts), path))
        else:
            request.system.extend(texts)
    elif role == "assistant":
        for block in blocks:
            _add(request, "assistant", block, path)
    else:
        request.messages.append(internal.Message("user", blocks, path))


def _system_text(block: internal.Block) -> internal.Text:
    if not isinstance(block, internal.Text):
        raise MalformedRequest(f"{block.path} must be text in a system message", param=block.path)
    return block


def _parse_part(part: dict[str, Any], path: str) -> internal.Block:
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return internal.Text(fields.required_str(part, "text", fields.at(path, "text")), path=path)
    if kind == "refusal":
        return internal.Refusal(
            fields.required_str(part, "refusal", fields.at(path, "refusal")), path
        )
    if kind == "input_image":
        return _parse_image(part, path)
    if kind == "input_file":
        return internal.Raw(NAME, part, path)
    raise MalformedRequest(
        f"{path}.type must be input_text, input_image, input_file, output_text or refusal",
        param=fields.at(path, "type"),
    )


def _parse_image(part: dict[str, Any], path: str) -> internal.Image:
    detail = fields.opt_choice(
        part, "detail", fields.at(path, "detail"), ("auto", "low", "high", "original")
    )
    file_id = fields.opt_str(part, "file_id", fields.at(path, "file_id"))
    url = fields.opt_str(part, "image_url", fields.at(path, "image_url"))
    if file_id is not None:
        return internal.Image(file_id=file_id, origin=NAME, detail=detail, path=path)
    if url is None:
        raise MalformedRequest(
            f"{path}.image_url or {path}.file_id is required", param=fields.at(path, "image_url")
        )
    return image_from_url(url, detail, path, fields.at(path, "image_url"))


def _parse_function_call(item: dict[str, Any], path: str) -> internal.ToolCall:
    return internal.ToolCall(
        id=fields.required_str(item, "call_id", fields.at(path, "call_id"), non_empty=True),
        name=fields.required_str(item, "name", fields.at(path, "name")),
        arguments=fields.required_str(item, "arguments", fields.at(path, "arguments")),
        path=path,
    )


def _parse_function_output(item: dict[str, Any], path: str) -> internal.ToolResult:
    call_id = fields.required_str(item, "call_id", fields.at(path, "call_id"))
    output = fields.required(item, "output", fields.at(path, "output"))
    output_path = fields.at(path, "output")
    if isinstance(output, str):
        return internal.ToolResult(call_id, [internal.Text(output, path=output_path)], path=path)
    parts = [
        _parse_part(part, part_path) for part, part_path in fields.objects(output, output_path)
    ]
    return internal.ToolResult(call_id, parts, path=path)


def _parse_reasoning_item(item: dict[str, Any], path: str) -> internal.Thinking:
    texts = []
    for key, kind in (("summary", "summary_text"), ("content", "reasoning_text")):
        key_path = fields.at(path, key)
        for part, part_path in fields.objects(fields.opt_array(item, key, key_path), key_path):
            if part.get("type") != kind:
                raise MalformedRequest(
                    f"{part_path}.type must be {kind}", param=fields.at(part_path, "type")
                )
            texts.append(fields.required_str(part, "text", fields.at(part_path, "text")))
        if texts:
            break  # the summary when there is one, else the raw reasoning text
    return from_client(
        "\n\n".join(texts),
        fields.opt_str(item, "encrypted_content", fields.at(path, "encrypted_content")),
        NAME,
        item_id=fields.required_str(item, "id", fields.at(path, "id")),
        path=path,
    )


def _parse_tool(tool: Any, path: str) -> internal.Tool | internal.Raw:
    tool = fields.obj(tool, path)
    if tool.get("type") != "function":
        return internal.Raw(NAME, tool, path)  # built-in tools: web search, file search, MCP, ...
    extras = {
        k: v
        for k, v in tool.items()
        if k not in ("type", "name", "description", "parameters", "strict")
    }
    return internal.Tool(
        name=fields.required_str(tool, "name", fields.at(path, "name"), non_empty=True),
        **function_fields(tool, path),
        extras=extras,
        path=path,
    )


def _parse_tool_choice(choice: Any) -> internal.ToolChoice | internal.Raw | None:
    choice = tool_choice_mode(choice)
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") == "function":
        return internal.ToolChoice("tool", fields.required_str(choice, "name", "tool_choice.name"))
    return internal.Raw(NAME, choice, "tool_choice")


def _parse_text(data: dict[str, Any]) -> internal.ResponseFormat | None:
    text = fields.opt_obj(data, "text", "text")
    spec = None if text is None else fields.opt_obj(text, "format", "text.format")
    if spec is None:
        return None
    kind = spec.get("type")
    if kind in ("text", "json_object"):
        return internal.ResponseFormat(kind)
    if kind != "json_schema":
        raise MalformedRequest(
            "text.format.type must be text, json_object or json_schema", param="text.format.type"
        )
    return internal.ResponseFormat(
        "json_schema",
        name=fields.required_str(spec, "name", "text.format.name"),
        schema=fields.required_obj(spec, "schema", "text.format.schema"),
        strict=fields.opt_bool(spec, "strict", "text.format.strict"),
        description=fields.opt_str(spec, "description", "text.format.description"),
    )


def _parse_reasoning(data: dict[str, Any]) -> internal.Reasoning | None:
    reasoning = fields.opt_obj(data, "reasoning", "reasoning")
    if reasoning is None:
        return None
    summary = fields.opt_choice(reasoning, "summary", "reasoning.summary", SUMMARIES)
    summary = summary or fields.opt_choice(
        reasoning, "generate_summary", "reasoning.generate_summary", SUMMARIES
    )
    effort = fields.opt_choice(reasoning, "effort", "reasoning.effort", EFFORTS)
    if effort is None and summary is None:
        return None
    return internal.Reasoning(effort=effort, summary=summary)
