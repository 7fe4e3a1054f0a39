"""Chat Completions requests from clients: a body into the internal shape, checked field by field.

Leading ``system``/``developer`` messages become the system prompt; later ones stay in place as
system messages. Consecutive ``tool`` messages become one user turn of tool results (Anthropic's
shape). Content parts the shape does not model (audio, files) are kept as ``Raw``; known fields
that change the answer and that no other format can carry (log-probabilities, logit bias, audio
output, predicted outputs) are listed as unportable.
"""

from __future__ import annotations

from typing import Any

from gateway.formats import fields, internal
from gateway.formats.errors import MalformedRequest
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


def parse_request(body: bytes | str | dict[str, Any]) -> internal.ChatRequest:
    data = fields.load_object(body)
    model = fields.required_str(data, "model", "model", non_empty=True)
    request = internal.ChatRequest(model=model, source=NAME, messages=[])
    _parse_messages(
        request, fields.array(fields.required(data, "messages", "messages"), "messages")
    )
    tools = fields.opt_array(data, "tools", "tools")
    request.tools = [_parse_tool(tool, fields.at("tools", i)) for i, tool in enumerate(tools)]
    request.tool_choice = _parse_tool_choice(data.get("tool_choice"))
    request.parallel_tool_calls = fields.opt_bool(
        data, "parallel_tool_calls", "parallel_tool_calls"
    )
    limit = fields.opt_int(data, "max_completion_tokens", "max_completion_tokens", 1, 10**9)
    request.max_tokens = limit or fields.opt_int(data, "max_tokens", "max_tokens", 1, 10**9)
    request.temperature = fields.opt_number(data, "temperature", "temperature", 0, 2)
    request.top_p = fields.opt_number(data, "top_p", "top_p", 0, 1)
    request.stop = _parse_stop(data.get("stop"))
    request.n = fields.opt_int(data, "n", "n", 1, 128)
    request.seed = fields.opt_int(data, "seed", "seed", -(2**63), 2**63 - 1)
    request.presence_penalty = fields.opt_number(
        data, "presence_penalty", "presence_penalty", -2, 2
    )
    request.frequency_penalty = fields.opt_number(
        data, "frequency_penalty", "frequency_penalty", -2, 2
    )
    request.response_format = _parse_response_format(data.get("response_format"))
    effort = fields.opt_choice(data, "reasoning_effort", "reasoning_effort", EFFORTS)
    request.reasoning = internal.Reasoning(effort=effort) if effort else None
    request.user = fields.opt_str(data, "user", "user")
    if data.get("metadata") is not None:
        request.metadata = fields.string_map(data["metadata"], "metadata")
    request.stream = bool(fields.opt_bool(data, "stream", "stream"))
    options = data.get("stream_options")
    if options is not None:
        request.include_usage = fields.opt_bool(
            fields.obj(options, "stream_options"), "include_usage", "stream_options.include_usage"
        )
    request.extras = {key: value for key, value in data.items() if key not in _MODELLED}
    _mark_unportable(request, data)
    return request


def _mark_unportable(request: internal.ChatRequest, data: dict[str, Any]) -> None:
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


def _parse_messages(request: internal.ChatRequest, messages: list[Any]) -> None:
    for index, item in enumerate(messages):
        path = fields.at("messages", index)
        message = fields.obj(item, path)
        role = message.get("role")
        if role in ("system", "developer"):
            texts = _text_parts(message.get("content"), fields.at(path, "content"))
            if request.messages:
                request.messages.append(internal.Message("system", list(texts), path))
            else:
                request.system.extend(texts)
        elif role == "user":
            content = _user_content(
                fields.required(message, "content", fields.at(path, "content")), path
            )
            request.messages.append(internal.Message("user", content, path))
        elif role == "assistant":
            request.messages.append(
                internal.Message("assistant", _assistant_content(message, path), path)
            )
        elif role == "tool":
            result = _tool_result(message, path)
            previous = request.messages[-1] if request.messages else None
            if previous and previous.role == "user" and _only_tool_results(previous.content):
                previous.content.append(result)
            else:
                request.messages.append(internal.Message("user", [result], path))
        elif role == "function":
            request.messages.append(
                internal.Message("user", [internal.Raw(NAME, message, path)], path)
            )
        else:
            raise MalformedRequest(
                f"{fields.at(path, 'role')} must be one of: system, developer, user, assistant, tool",
                param=fields.at(path, "role"),
            )


def _only_tool_results(blocks: list[internal.Block]) -> bool:
    return all(isinstance(block, internal.ToolResult) for block in blocks)


def _text_parts(content: Any, path: str) -> list[internal.Text]:
    if isinstance(content, str):
        return [internal.Text(content, path=path)]
    texts = []
    for part, part_path in fields.objects(content, path):
        if part.get("type") != "text":
            raise MalformedRequest(
                f"{part_path}.type must be text here", param=fields.at(part_path, "type")
            )
        text = fields.required_str(part, "text", fields.at(part_path, "text"))
        texts.append(internal.Text(text, path=part_path))
    return texts


def _user_content(content: Any, path: str) -> list[internal.Block]:
    content_path = fields.at(path, "content")
    if isinstance(content, str):
        return [internal.Text(content, path=content_path)]
    blocks: list[internal.Block] = []
    for part, part_path in fields.objects(content, content_path):
        kind = part.get("type")
        if kind == "text":
            text = fields.required_str(part, "text", fields.at(part_path, "text"))
            blocks.append(internal.Text(text, path=part_path))
        elif kind == "image_url":
            blocks.append(_image(part, part_path))
        elif kind in ("input_audio", "file"):
            blocks.append(internal.Raw(NAME, part, part_path))
        else:
            raise MalformedRequest(
                f"{part_path}.type must be one of: text, image_url, input_audio, file",
                param=fields.at(part_path, "type"),
            )
    return blocks


def _image(part: dict[str, Any], path: str) -> internal.Image:
    spec = fields.required_obj(part, "image_url", fields.at(path, "image_url"))
    url = fields.required_str(spec, "url", fields.at(path, "image_url.url"))
    detail = fields.opt_choice(
        spec, "detail", fields.at(path, "image_url.detail"), ("auto", "low", "high")
    )
    return image_from_url(url, detail, path, fields.at(path, "image_url.url"))


def _assistant_content(message: dict[str, Any], path: str) -> list[internal.Block]:
    blocks: list[internal.Block] = []
    content = message.get("content")
    content_path = fields.at(path, "content")
    if isinstance(content, str):
        if content:
            blocks.append(internal.Text(content, path=content_path))
    elif content is not None:
        for part, part_path in fields.objects(content, content_path):
            if part.get("type") == "text":
                text = fields.required_str(part, "text", fields.at(part_path, "text"))
                blocks.append(internal.Text(text, path=part_path))
            elif part.get("type") == "refusal":
                refusal = fields.required_str(part, "refusal", fields.at(part_path, "refusal"))
                blocks.append(internal.Refusal(refusal, part_path))
            else:
                raise MalformedRequest(
                    f"{part_path}.type must be text or refusal", param=fields.at(part_path, "type")
                )
    refusal = fields.opt_str(message, "refusal", fields.at(path, "refusal"))
    if refusal:
        blocks.append(internal.Refusal(refusal, fields.at(path, "refusal")))
    calls = fields.opt_array(message, "tool_calls", fields.at(path, "tool_calls"))
    for index, call in enumerate(calls):
        blocks.append(_tool_call(call, fields.at(fields.at(path, "tool_calls"), index)))
    for legacy in ("function_call", "audio"):
        if message.get(legacy) is not None:
            blocks.append(internal.Raw(NAME, {legacy: message[legacy]}, fields.at(path, legacy)))
    return blocks


def _tool_call(call: Any, path: str) -> internal.Block:
    call = fields.obj(call, path)
    if call.get("type", "function") != "function":
        return internal.Raw(NAME, call, path)
    function = fields.required_obj(call, "function", fields.at(path, "function"))
    return internal.ToolCall(
        id=fields.required_str(call, "id", fields.at(path, "id"), non_empty=True),
        name=fields.required_str(function, "name", fields.at(path, "function.name")),
        arguments=fields.string(
            function.get("arguments", ""), fields.at(path, "function.arguments")
        ),
        path=path,
    )


def _tool_result(message: dict[str, Any], path: str) -> internal.ToolResult:
    call_id = fields.required_str(message, "tool_call_id", fields.at(path, "tool_call_id"))
    content = _text_parts(
        fields.required(message, "content", fields.at(path, "content")), fields.at(path, "content")
    )
    return internal.ToolResult(call_id, list(content), path=path)


def _parse_tool(tool: Any, path: str) -> internal.Tool | internal.Raw:
    tool = fields.obj(tool, path)
    if tool.get("type") != "function":
        return internal.Raw(NAME, tool, path)
    function = fields.required_obj(tool, "function", fields.at(path, "function"))
    name = fields.required_str(function, "name", fields.at(path, "function.name"))
    return internal.Tool(
        name=name, **function_fields(function, fields.at(path, "function")), path=path
    )


def _parse_tool_choice(choice: Any) -> internal.ToolChoice | internal.Raw | None:
    choice = tool_choice_mode(choice)
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") == "function":
        function = fields.required_obj(choice, "function", "tool_choice.function")
        name = fields.required_str(function, "name", "tool_choice.function.name")
        return internal.ToolChoice("tool", name)
    return internal.Raw(NAME, choice, "tool_choice")


def _parse_stop(stop: Any) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    return [
        fields.string(item, fields.at("stop", i))
        for i, item in enumerate(fields.array(stop, "stop"))
    ]


def _parse_response_format(value: Any) -> internal.ResponseFormat | None:
    if value is None:
        return None
    spec = fields.obj(value, "response_format")
    kind = spec.get("type")
    if kind in ("text", "json_object"):
        return internal.ResponseFormat(kind)
    if kind != "json_schema":
        raise MalformedRequest(
            "response_format.type must be text, json_object or json_schema",
            param="response_format.type",
        )
    schema = fields.required_obj(spec, "json_schema", "response_format.json_schema")
    body = schema.get("schema")
    return internal.ResponseFormat(
        "json_schema",
        name=fields.required_str(schema, "name", "response_format.json_schema.name"),
        schema=None if body is None else fields.obj(body, "response_format.json_schema.schema"),
        strict=fields.opt_bool(schema, "strict", "response_format.json_schema.strict"),
        description=fields.opt_str(
            schema, "description", "response_format.json_schema.description"
        ),
    )
