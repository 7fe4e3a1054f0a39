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

from gateway.formats.errors import InvalidRequest
from gateway.formats.fields import (
    array,
    at,
    load_object,
    obj,
    opt_array,
    opt_bool,
    opt_choice,
    opt_int,
    opt_number,
    opt_obj,
    opt_str,
    required,
    string,
    string_map,
)
from gateway.formats.internal import (
    Block,
    ChatRequest,
    Image,
    Message,
    Raw,
    Reasoning,
    Refusal,
    ResponseFormat,
    Role,
    Text,
    Thinking,
    Tool,
    ToolCall,
    ToolChoice,
    ToolResult,
)
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


def parse_request(body: bytes | str | dict[str, Any]) -> ChatRequest:
    data = load_object(body)
    _refuse_stateful(data)
    model = string(required(data, "model", "model"), "model", non_empty=True)
    request = ChatRequest(model=model, source=NAME, messages=[])
    instructions = opt_str(data, "instructions", "instructions")
    if instructions:
        request.system.append(Text(instructions, path="instructions"))
    _parse_input(request, required(data, "input", "input"))
    tools = opt_array(data, "tools", "tools")
    request.tools = [_parse_tool(tool, at("tools", i)) for i, tool in enumerate(tools)]
    request.tool_choice = _parse_tool_choice(data.get("tool_choice"))
    request.parallel_tool_calls = opt_bool(data, "parallel_tool_calls", "parallel_tool_calls")
    request.max_tokens = opt_int(data, "max_output_tokens", "max_output_tokens", 1, 10**9)
    request.temperature = opt_number(data, "temperature", "temperature", 0, 2)
    request.top_p = opt_number(data, "top_p", "top_p", 0, 1)
    request.response_format = _parse_text(data)
    request.reasoning = _parse_reasoning(data)
    request.user = opt_str(data, "user", "user")
    if data.get("metadata") is not None:
        request.metadata = string_map(data["metadata"], "metadata")
    request.stream = bool(opt_bool(data, "stream", "stream"))
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
            raise InvalidRequest(f"{name} is not supported: {STATELESS}", param=name)
    if data.get("background") is True:
        raise InvalidRequest(f"background is not supported: {STATELESS}", param="background")
    if data.get("store") is True:
        raise InvalidRequest(
            f"store: true is not supported: {STATELESS}; omit store or set it to false",
            param="store",
        )
    opt_bool(data, "store", "store")


def _parse_input(request: ChatRequest, value: Any) -> None:
    if isinstance(value, str):
        request.messages.append(Message("user", [Text(value, path="input")], "input"))
        return
    for index, item in enumerate(array(value, "input")):
        path = at("input", index)
        item = obj(item, path)
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
            raise InvalidRequest(f"item_reference items are not supported: {STATELESS}", param=path)
        elif isinstance(kind, str):
            role: Role = "user" if kind.endswith("_output") else "assistant"
            _add(request, role, Raw(NAME, item, path), path)
        else:
            raise InvalidRequest(f"{path}.type must be a string", param=at(path, "type"))


def _add(request: ChatRequest, role: Role, block: Block, path: str) -> None:
    """Appends to the last turn when it is the same side; tool results join only each other."""
    last = request.messages[-1] if request.messages else None
    if last is not None and last.role == role:
        joins = role == "assistant" or (
            isinstance(block, ToolResult)
            and all(isinstance(item, ToolResult) for item in last.content)
        )
        if joins:
            last.content.append(block)
            return
    request.messages.append(Message(role, [block], path))


def _parse_message_item(request: ChatRequest, item: dict[str, Any], path: str) -> None:
    role = item.get("role")
    content_path = at(path, "content")
    content = required(item, "content", content_path)
    if role not in ("user", "assistant", "system", "developer"):
        raise InvalidRequest(
            f"{path}.role must be user, assistant, system or developer", param=at(path, "role")
        )
    if isinstance(content, str):
        blocks: list[Block] = [Text(content, path=content_path)]
    else:
        blocks = [
            _parse_part(obj(part, at(content_path, i)), at(content_path, i))
            for i, part in enumerate(array(content, content_path))
        ]
    if role in ("system", "developer"):
        texts = [_system_text(block) for block in blocks]
        if request.messages:
            request.messages.append(Message("system", list(texts), path))
        else:
            request.system.extend(texts)
    elif role == "assistant":
        for block in blocks:
            _add(request, "assistant", block, path)
    else:
        request.messages.append(Message("user", blocks, path))


def _system_text(block: Block) -> Text:
    if not isinstance(block, Text):
        raise InvalidRequest(f"{block.path} must be text in a system message", param=block.path)
    return block


def _parse_part(part: dict[str, Any], path: str) -> Block:
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return Text(string(required(part, "text", at(path, "text")), at(path, "text")), path=path)
    if kind == "refusal":
        return Refusal(
            string(required(part, "refusal", at(path, "refusal")), at(path, "refusal")), path
        )
    if kind == "input_image":
        return _parse_image(part, path)
    if kind == "input_file":
        return Raw(NAME, part, path)
    raise InvalidRequest(
        f"{path}.type must be input_text, input_image, input_file, output_text or refusal",
        param=at(path, "type"),
    )


def _parse_image(part: dict[str, Any], path: str) -> Image:
    detail = opt_choice(part, "detail", at(path, "detail"), ("auto", "low", "high", "original"))
    file_id = opt_str(part, "file_id", at(path, "file_id"))
    url = opt_str(part, "image_url", at(path, "image_url"))
    if file_id is not None:
        return Image(file_id=file_id, origin=NAME, detail=detail, path=path)
    if url is None:
        raise InvalidRequest(
            f"{path}.image_url or {path}.file_id is required", param=at(path, "image_url")
        )
    return image_from_url(url, detail, path, at(path, "image_url"))


def _parse_function_call(item: dict[str, Any], path: str) -> ToolCall:
    return ToolCall(
        id=string(
            required(item, "call_id", at(path, "call_id")), at(path, "call_id"), non_empty=True
        ),
        name=string(required(item, "name", at(path, "name")), at(path, "name")),
        arguments=string(required(item, "arguments", at(path, "arguments")), at(path, "arguments")),
        path=path,
    )


def _parse_function_output(item: dict[str, Any], path: str) -> ToolResult:
    call_id = string(required(item, "call_id", at(path, "call_id")), at(path, "call_id"))
    output = required(item, "output", at(path, "output"))
    output_path = at(path, "output")
    if isinstance(output, str):
        return ToolResult(call_id, [Text(output, path=output_path)], path=path)
    parts = [
        _parse_part(obj(part, at(output_path, i)), at(output_path, i))
        for i, part in enumerate(array(output, output_path))
    ]
    return ToolResult(call_id, parts, path=path)


def _parse_reasoning_item(item: dict[str, Any], path: str) -> Thinking:
    texts = []
    for key, kind in (("summary", "summary_text"), ("content", "reasoning_text")):
        for i, part in enumerate(opt_array(item, key, at(path, key))):
            part_path = at(at(path, key), i)
            part = obj(part, part_path)
            if part.get("type") != kind:
                raise InvalidRequest(
                    f"{part_path}.type must be {kind}", param=at(part_path, "type")
                )
            texts.append(
                string(required(part, "text", at(part_path, "text")), at(part_path, "text"))
            )
        if texts:
            break  # the summary when there is one, else the raw reasoning text
    return from_client(
        "\n\n".join(texts),
        opt_str(item, "encrypted_content", at(path, "encrypted_content")),
        NAME,
        item_id=string(required(item, "id", at(path, "id")), at(path, "id")),
        path=path,
    )


def _parse_tool(tool: Any, path: str) -> Tool | Raw:
    tool = obj(tool, path)
    if tool.get("type") != "function":
        return Raw(NAME, tool, path)  # built-in tools: web search, file search, MCP, ...
    extras = {
        k: v
        for k, v in tool.items()
        if k not in ("type", "name", "description", "parameters", "strict")
    }
    return Tool(
        name=string(required(tool, "name", at(path, "name")), at(path, "name"), non_empty=True),
        **function_fields(tool, path),
        extras=extras,
        path=path,
    )


def _parse_tool_choice(choice: Any) -> ToolChoice | Raw | None:
    choice = tool_choice_mode(choice)
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") == "function":
        return ToolChoice(
            "tool", string(required(choice, "name", "tool_choice.name"), "tool_choice.name")
        )
    return Raw(NAME, choice, "tool_choice")


def _parse_text(data: dict[str, Any]) -> ResponseFormat | None:
    text = opt_obj(data, "text", "text")
    spec = None if text is None else opt_obj(text, "format", "text.format")
    if spec is None:
        return None
    kind = spec.get("type")
    if kind in ("text", "json_object"):
        return ResponseFormat(kind)
    if kind != "json_schema":
        raise InvalidRequest(
            "text.format.type must be text, json_object or json_schema", param="text.format.type"
        )
    return ResponseFormat(
        "json_schema",
        name=string(required(spec, "name", "text.format.name"), "text.format.name"),
        schema=obj(required(spec, "schema", "text.format.schema"), "text.format.schema"),
        strict=opt_bool(spec, "strict", "text.format.strict"),
        description=opt_str(spec, "description", "text.format.description"),
    )


def _parse_reasoning(data: dict[str, Any]) -> Reasoning | None:
    reasoning = opt_obj(data, "reasoning", "reasoning")
    if reasoning is None:
        return None
    summary = opt_choice(reasoning, "summary", "reasoning.summary", SUMMARIES)
    summary = summary or opt_choice(
        reasoning, "generate_summary", "reasoning.generate_summary", SUMMARIES
    )
    effort = opt_choice(reasoning, "effort", "reasoning.effort", EFFORTS)
    if effort is None and summary is None:
        return None
    return Reasoning(effort=effort, summary=summary)
