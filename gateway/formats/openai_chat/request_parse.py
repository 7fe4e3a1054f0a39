"""Chat Completions requests from clients: a body into the internal shape, checked field by field.

Leading ``system``/``developer`` messages become the system prompt; later ones stay in place as
system messages. Consecutive ``tool`` messages become one user turn of tool results (Anthropic's
shape). Content parts the shape does not model (audio, files) are kept as ``Raw``; known fields
that change the answer and that no other format can carry (log-probabilities, logit bias, audio
output, predicted outputs) are listed as unportable.
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
    Text,
    Tool,
    ToolCall,
    ToolChoice,
    ToolResult,
)
from gateway.formats.media import image_from_url
from gateway.formats.openai_tools import function_fields, tool_choice_mode

NAME = "openai_chat"
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
_MODELLED = frozenset(
    {
        "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "max_tokens",
        "max_completion_tokens", "temperature", "top_p", "stop", "n", "seed",
        "presence_penalty", "frequency_penalty", "response_format", "reasoning_effort", "user",
        "metadata", "stream", "stream_options",
    }
)  # fmt: skip


def parse_request(body: bytes | str | dict[str, Any]) -> ChatRequest:
    data = load_object(body)
    model = string(required(data, "model", "model"), "model", non_empty=True)
    request = ChatRequest(model=model, source=NAME, messages=[])
    _parse_messages(request, array(required(data, "messages", "messages"), "messages"))
    tools = opt_array(data, "tools", "tools")
    request.tools = [_parse_tool(tool, at("tools", i)) for i, tool in enumerate(tools)]
    request.tool_choice = _parse_tool_choice(data.get("tool_choice"))
    request.parallel_tool_calls = opt_bool(data, "parallel_tool_calls", "parallel_tool_calls")
    limit = opt_int(data, "max_completion_tokens", "max_completion_tokens", 1, 10**9)
    request.max_tokens = limit or opt_int(data, "max_tokens", "max_tokens", 1, 10**9)
    request.temperature = opt_number(data, "temperature", "temperature", 0, 2)
    request.top_p = opt_number(data, "top_p", "top_p", 0, 1)
    request.stop = _parse_stop(data.get("stop"))
    request.n = opt_int(data, "n", "n", 1, 128)
    request.seed = opt_int(data, "seed", "seed", -(2**63), 2**63 - 1)
    request.presence_penalty = opt_number(data, "presence_penalty", "presence_penalty", -2, 2)
    request.frequency_penalty = opt_number(data, "frequency_penalty", "frequency_penalty", -2, 2)
    request.response_format = _parse_response_format(data.get("response_format"))
    effort = opt_choice(data, "reasoning_effort", "reasoning_effort", EFFORTS)
    request.reasoning = Reasoning(effort=effort) if effort else None
    request.user = opt_str(data, "user", "user")
    if data.get("metadata") is not None:
        request.metadata = string_map(data["metadata"], "metadata")
    request.stream = bool(opt_bool(data, "stream", "stream"))
    options = data.get("stream_options")
    if options is not None:
        request.include_usage = opt_bool(
            obj(options, "stream_options"), "include_usage", "stream_options.include_usage"
        )
    request.extras = {key: value for key, value in data.items() if key not in _MODELLED}
    _mark_unportable(request, data)
    return request


def _mark_unportable(request: ChatRequest, data: dict[str, Any]) -> None:
    """Known fields that change the answer and that no other format can carry."""
    checks = {
        "logprobs": (data.get("logprobs") is True, "token log-probabilities"),
        "top_logprobs": (bool(data.get("top_logprobs")), "token log-probabilities"),
        "logit_bias": (bool(data.get("logit_bias")), "token biases"),
        "modalities": (
            data.get("modalities") not in (None, ["text"]),
            "output modalities other than text",
        ),
        "audio": (data.get("audio") is not None, "audio output"),
        "prediction": (data.get("prediction") is not None, "predicted outputs"),
        "web_search_options": (data.get("web_search_options") is not None, "built-in web search"),
        "functions": (data.get("functions") is not None, "legacy functions (use tools)"),
        "function_call": (data.get("function_call") is not None, "legacy function_call"),
    }
    for name, (present, why) in checks.items():
        if present:
            request.unportable[name] = why


def _parse_messages(request: ChatRequest, messages: list[Any]) -> None:
    for index, item in enumerate(messages):
        path = at("messages", index)
        message = obj(item, path)
        role = message.get("role")
        if role in ("system", "developer"):
            texts = _text_parts(message.get("content"), at(path, "content"))
            if request.messages:
                request.messages.append(Message("system", list(texts), path))
            else:
                request.system.extend(texts)
        elif role == "user":
            content = _user_content(required(message, "content", at(path, "content")), path)
            request.messages.append(Message("user", content, path))
        elif role == "assistant":
            request.messages.append(Message("assistant", _assistant_content(message, path), path))
        elif role == "tool":
            result = _tool_result(message, path)
            previous = request.messages[-1] if request.messages else None
            if previous and previous.role == "user" and _only_tool_results(previous.content):
                previous.content.append(result)
            else:
                request.messages.append(Message("user", [result], path))
        elif role == "function":
            request.messages.append(Message("user", [Raw(NAME, message, path)], path))
        else:
            raise InvalidRequest(
                f"{at(path, 'role')} must be one of: system, developer, user, assistant, tool",
                param=at(path, "role"),
            )


def _only_tool_results(blocks: list[Block]) -> bool:
    return all(isinstance(block, ToolResult) for block in blocks)


def _text_parts(content: Any, path: str) -> list[Text]:
    if isinstance(content, str):
        return [Text(content, path=path)]
    parts = array(content, path)
    texts = []
    for index, part in enumerate(parts):
        part_path = at(path, index)
        part = obj(part, part_path)
        if part.get("type") != "text":
            raise InvalidRequest(f"{part_path}.type must be text here", param=at(part_path, "type"))
        texts.append(
            Text(
                string(required(part, "text", at(part_path, "text")), at(part_path, "text")),
                path=part_path,
            )
        )
    return texts


def _user_content(content: Any, path: str) -> list[Block]:
    content_path = at(path, "content")
    if isinstance(content, str):
        return [Text(content, path=content_path)]
    blocks: list[Block] = []
    for index, part in enumerate(array(content, content_path)):
        part_path = at(content_path, index)
        part = obj(part, part_path)
        kind = part.get("type")
        if kind == "text":
            text = string(required(part, "text", at(part_path, "text")), at(part_path, "text"))
            blocks.append(Text(text, path=part_path))
        elif kind == "image_url":
            blocks.append(_image(part, part_path))
        elif kind in ("input_audio", "file"):
            blocks.append(Raw(NAME, part, part_path))
        else:
            raise InvalidRequest(
                f"{part_path}.type must be one of: text, image_url, input_audio, file",
                param=at(part_path, "type"),
            )
    return blocks


def _image(part: dict[str, Any], path: str) -> Image:
    spec = obj(required(part, "image_url", at(path, "image_url")), at(path, "image_url"))
    url = string(required(spec, "url", at(path, "image_url.url")), at(path, "image_url.url"))
    detail = opt_choice(spec, "detail", at(path, "image_url.detail"), ("auto", "low", "high"))
    return image_from_url(url, detail, path, at(path, "image_url.url"))


def _assistant_content(message: dict[str, Any], path: str) -> list[Block]:
    blocks: list[Block] = []
    content = message.get("content")
    content_path = at(path, "content")
    if isinstance(content, str):
        if content:
            blocks.append(Text(content, path=content_path))
    elif content is not None:
        for index, part in enumerate(array(content, content_path)):
            part_path = at(content_path, index)
            part = obj(part, part_path)
            if part.get("type") == "text":
                text = string(required(part, "text", at(part_path, "text")), at(part_path, "text"))
                blocks.append(Text(text, path=part_path))
            elif part.get("type") == "refusal":
                refusal = required(part, "refusal", at(part_path, "refusal"))
                blocks.append(Refusal(string(refusal, at(part_path, "refusal")), part_path))
            else:
                raise InvalidRequest(
                    f"{part_path}.type must be text or refusal", param=at(part_path, "type")
                )
    refusal = opt_str(message, "refusal", at(path, "refusal"))
    if refusal:
        blocks.append(Refusal(refusal, at(path, "refusal")))
    calls = opt_array(message, "tool_calls", at(path, "tool_calls"))
    for index, call in enumerate(calls):
        blocks.append(_tool_call(call, at(at(path, "tool_calls"), index)))
    for legacy in ("function_call", "audio"):
        if message.get(legacy) is not None:
            blocks.append(Raw(NAME, {legacy: message[legacy]}, at(path, legacy)))
    return blocks


def _tool_call(call: Any, path: str) -> Block:
    call = obj(call, path)
    if call.get("type", "function") != "function":
        return Raw(NAME, call, path)
    function = obj(required(call, "function", at(path, "function")), at(path, "function"))
    return ToolCall(
        id=string(required(call, "id", at(path, "id")), at(path, "id"), non_empty=True),
        name=string(
            required(function, "name", at(path, "function.name")), at(path, "function.name")
        ),
        arguments=string(function.get("arguments", ""), at(path, "function.arguments")),
        path=path,
    )


def _tool_result(message: dict[str, Any], path: str) -> ToolResult:
    call_id = string(
        required(message, "tool_call_id", at(path, "tool_call_id")), at(path, "tool_call_id")
    )
    content = _text_parts(required(message, "content", at(path, "content")), at(path, "content"))
    return ToolResult(call_id, list(content), path=path)


def _parse_tool(tool: Any, path: str) -> Tool | Raw:
    tool = obj(tool, path)
    if tool.get("type") != "function":
        return Raw(NAME, tool, path)
    function = obj(required(tool, "function", at(path, "function")), at(path, "function"))
    name = string(required(function, "name", at(path, "function.name")), at(path, "function.name"))
    return Tool(name=name, **function_fields(function, at(path, "function")), path=path)


def _parse_tool_choice(choice: Any) -> ToolChoice | Raw | None:
    choice = tool_choice_mode(choice)
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") == "function":
        function = obj(required(choice, "function", "tool_choice.function"), "tool_choice.function")
        name = string(
            required(function, "name", "tool_choice.function.name"), "tool_choice.function.name"
        )
        return ToolChoice("tool", name)
    return Raw(NAME, choice, "tool_choice")


def _parse_stop(stop: Any) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    return [string(item, at("stop", i)) for i, item in enumerate(array(stop, "stop"))]


def _parse_response_format(value: Any) -> ResponseFormat | None:
    if value is None:
        return None
    spec = obj(value, "response_format")
    kind = spec.get("type")
    if kind in ("text", "json_object"):
        return ResponseFormat(kind)
    if kind != "json_schema":
        raise InvalidRequest(
            "response_format.type must be text, json_object or json_schema",
            param="response_format.type",
        )
    schema = obj(
        required(spec, "json_schema", "response_format.json_schema"), "response_format.json_schema"
    )
    body = schema.get("schema")
    return ResponseFormat(
        "json_schema",
        name=string(
            required(schema, "name", "response_format.json_schema.name"),
            "response_format.json_schema.name",
        ),
        schema=None if body is None else obj(body, "response_format.json_schema.schema"),
        strict=opt_bool(schema, "strict", "response_format.json_schema.strict"),
        description=opt_str(schema, "description", "response_format.json_schema.description"),
    )
