"""Anthropic Messages requests from clients: a body into the internal shape, checked field by field.

The shapes match closely (system prompt, typed blocks, tool results in user turns), so parsing
mostly checks types. Blocks and tools the shape does not model (documents, server tools) are
kept as ``Raw``; the container, MCP servers and context management are listed as unportable.
"""

from __future__ import annotations

from typing import Any

from gateway.formats import fields, internal
from gateway.formats.errors import MalformedRequest
from gateway.formats.media import ANTHROPIC_IMAGE_TYPES
from gateway.formats.signatures import from_client

NAME = "anthropic_messages"
THINKING_MODES = ("enabled", "adaptive", "disabled", "between_tools")
EFFORTS = ("low", "medium", "high", "xhigh", "max")
_MODELLED = frozenset(
    {
        "model", "messages", "max_tokens", "system", "tools", "tool_choice", "temperature",
        "top_p", "top_k", "stop_sequences", "stream", "metadata", "thinking", "output_config",
        "cache_control",
    }
)  # fmt: skip
_TOOL_FIELDS = frozenset({"type", "name", "description", "input_schema", "strict", "cache_control"})
_UNPORTABLE = {
    "container": "code-execution containers exist only at Anthropic",
    "mcp_servers": "Anthropic's MCP connector",
    "context_management": "Anthropic's server-side context editing",
}


def parse_request(body: bytes | str | dict[str, Any]) -> internal.ChatRequest:
    data = fields.load_object(body)
    model = fields.required_str(data, "model", "model", non_empty=True)
    request = internal.ChatRequest(model=model, source=NAME, messages=[])
    request.max_tokens = fields.opt_int(data, "max_tokens", "max_tokens", 0, 10**9)
    if request.max_tokens is None:
        raise MalformedRequest("max_tokens is required", param="max_tokens")
    request.system = _parse_system(data.get("system"))
    request.messages = [
        _parse_message(item, fields.at("messages", i))
        for i, item in enumerate(
            fields.array(fields.required(data, "messages", "messages"), "messages")
        )
    ]
    tools = fields.opt_array(data, "tools", "tools")
    request.tools = [_parse_tool(tool, fields.at("tools", i)) for i, tool in enumerate(tools)]
    _parse_tool_choice(request, data.get("tool_choice"))
    request.temperature = fields.opt_number(data, "temperature", "temperature", 0, 1)
    request.top_p = fields.opt_number(data, "top_p", "top_p", 0, 1)
    request.top_k = fields.opt_int(data, "top_k", "top_k", 0, 10**9)
    stops = fields.opt_array(data, "stop_sequences", "stop_sequences")
    request.stop = [
        fields.string(stop, fields.at("stop_sequences", i)) for i, stop in enumerate(stops)
    ]
    request.stream = bool(fields.opt_bool(data, "stream", "stream"))
    metadata = fields.opt_obj(data, "metadata", "metadata")
    if metadata is not None:
        request.user = fields.opt_str(metadata, "user_id", "metadata.user_id")
    request.reasoning = _parse_reasoning(data)
    request.response_format = _parse_output_format(data)
    request.cache_control = fields.opt_obj(data, "cache_control", "cache_control")
    request.extras = {key: value for key, value in data.items() if key not in _MODELLED}
    for name, why in _UNPORTABLE.items():
        if data.get(name) is not None:
            request.unportable[name] = why
    return request


def _parse_system(system: Any) -> list[internal.Text]:
    if system is None:
        return []
    if isinstance(system, str):
        return [internal.Text(system, path="system")]
    return [
        _text_block(block, block_path) for block, block_path in fields.objects(system, "system")
    ]


def _text_block(block: dict[str, Any], path: str) -> internal.Text:
    if block.get("type") != "text":
        raise MalformedRequest(f"{path}.type must be text", param=fields.at(path, "type"))
    text = fields.required_str(block, "text", fields.at(path, "text"))
    return internal.Text(
        text, fields.opt_obj(block, "cache_control", fields.at(path, "cache_control")), path
    )


def _parse_message(item: Any, path: str) -> internal.Message:
    message = fields.obj(item, path)
    role = message.get("role")
    if role not in ("user", "assistant", "system"):
        raise MalformedRequest(
            f"{path}.role must be user, assistant or system", param=fields.at(path, "role")
        )
    content = fields.required(message, "content", fields.at(path, "content"))
    content_path = fields.at(path, "content")
    if isinstance(content, str):
        return internal.Message(role, [internal.Text(content, path=content_path)], path)
    blocks = [
        _parse_block(block, block_path)
        for block, block_path in fields.objects(content, content_path)
    ]
    if role == "system" and not all(isinstance(block, internal.Text) for block in blocks):
        raise MalformedRequest(
            f"{content_path} of a system message must be text blocks", param=content_path
        )
    return internal.Message(role, blocks, path)


def _parse_block(block: dict[str, Any], path: str) -> internal.Block:
    kind = block.get("type")
    cache = fields.opt_obj(block, "cache_control", fields.at(path, "cache_control"))
    if kind == "text":
        return _text_block(block, path)
    if kind == "image":
        return _parse_image(block, path, cache)
    if kind == "tool_use":
        tool_input = fields.required_obj(block, "input", fields.at(path, "input"))
        return internal.ToolCall(
            id=fields.required_str(block, "id", fields.at(path, "id"), non_empty=True),
            name=fields.required_str(block, "name", fields.at(path, "name")),
            arguments=fields.dumps(tool_input),
            cache_control=cache,
            path=path,
        )
    if kind == "tool_result":
        return _parse_tool_result(block, path, cache)
    if kind == "thinking":
        thinking = fields.required_str(block, "thinking", fields.at(path, "thinking"))
        signature = fields.required_str(block, "signature", fields.at(path, "signature"))
        return from_client(thinking, signature, NAME, path=path)
    if kind == "redacted_thinking":
        return internal.RedactedThinking(
            fields.required_str(block, "data", fields.at(path, "data")), path
        )
    if not isinstance(kind, str) or not kind:
        raise MalformedRequest(f"{path}.type is required", param=fields.at(path, "type"))
    return internal.Raw(NAME, block, path)  # documents, search results, server tool blocks


def _parse_image(block: dict[str, Any], path: str, cache: dict[str, Any] | None) -> internal.Image:
    source_path = fields.at(path, "source")
    source = fields.required_obj(block, "source", source_path)
    kind = source.get("type")
    if kind == "base64":
        media_type = fields.opt_choice(
            source, "media_type", fields.at(source_path, "media_type"), ANTHROPIC_IMAGE_TYPES
        )
        if media_type is None:
            raise MalformedRequest(
                f"{source_path}.media_type is required", param=fields.at(source_path, "media_type")
            )
        data = fields.required_str(source, "data", fields.at(source_path, "data"))
        return internal.Image(data=data, media_type=media_type, cache_control=cache, path=path)
    if kind == "url":
        url = fields.required_str(source, "url", fields.at(source_path, "url"))
        return internal.Image(url=url, cache_control=cache, path=path)
    if kind == "file":
        file_id = fields.required_str(source, "file_id", fields.at(source_path, "file_id"))
        return internal.Image(file_id=file_id, origin=NAME, cache_control=cache, path=path)
    raise MalformedRequest(
        f"{source_path}.type must be base64, url or file", param=fields.at(source_path, "type")
    )


def _parse_tool_result(
    block: dict[str, Any], path: str, cache: dict[str, Any] | None
) -> internal.ToolResult:
    call_id = fields.required_str(block, "tool_use_id", fields.at(path, "tool_use_id"))
    content = block.get("content")
    content_path = fields.at(path, "content")
    blocks: list[internal.Block] = []
    if isinstance(content, str):
        blocks.append(internal.Text(content, path=content_path))
    elif content is not None:
        for item, item_path in fields.objects(content, content_path):
            if item.get("type") == "text":
                blocks.append(_text_block(item, item_path))
            elif item.get("type") == "image":
                blocks.append(
                    _parse_image(
                        item,
                        item_path,
                        fields.opt_obj(
                            item, "cache_control", fields.at(item_path, "cache_control")
                        ),
                    )
                )
            else:
                blocks.append(internal.Raw(NAME, item, item_path))
    is_error = bool(fields.opt_bool(block, "is_error", fields.at(path, "is_error")))
    return internal.ToolResult(call_id, blocks, is_error, cache, path)


def _parse_tool(tool: Any, path: str) -> internal.Tool | internal.Raw:
    tool = fields.obj(tool, path)
    if tool.get("type") not in (None, "custom") or "input_schema" not in tool:
        return internal.Raw(NAME, tool, path)  # Anthropic's server tools (web search, bash, ...)
    return internal.Tool(
        name=fields.required_str(tool, "name", fields.at(path, "name"), non_empty=True),
        description=fields.opt_str(tool, "description", fields.at(path, "description")),
        parameters=fields.obj(tool["input_schema"], fields.at(path, "input_schema")),
        strict=fields.opt_bool(tool, "strict", fields.at(path, "strict")),
        cache_control=fields.opt_obj(tool, "cache_control", fields.at(path, "cache_control")),
        extras={key: value for key, value in tool.items() if key not in _TOOL_FIELDS},
        path=path,
    )


def _parse_tool_choice(request: internal.ChatRequest, value: Any) -> None:
    if value is None:
        return
    choice = fields.obj(value, "tool_choice")
    kind = choice.get("type")
    modes = {"auto": "auto", "any": "required", "none": "none", "tool": "tool"}
    if kind not in modes:
        raise MalformedRequest(
            "tool_choice.type must be auto, any, tool or none", param="tool_choice.type"
        )
    name = None
    if kind == "tool":
        name = fields.required_str(choice, "name", "tool_choice.name", non_empty=True)
    request.tool_choice = internal.ToolChoice(modes[kind], name)  # type: ignore[arg-type]
    disable = fields.opt_bool(
        choice, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use"
    )
    if disable is not None:
        request.parallel_tool_calls = not disable


def _parse_reasoning(data: dict[str, Any]) -> internal.Reasoning | None:
    thinking = fields.opt_obj(data, "thinking", "thinking")
    config = fields.opt_obj(data, "output_config", "output_config")
    effort = (
        None
        if config is None
        else fields.opt_choice(config, "effort", "output_config.effort", EFFORTS)
    )
    if thinking is None and effort is None:
        return None
    reasoning = internal.Reasoning(effort=effort)
    if thinking is not None:
        reasoning.mode = fields.opt_choice(thinking, "type", "thinking.type", THINKING_MODES)
        if reasoning.mode is None:
            raise MalformedRequest("thinking.type is required", param="thinking.type")
        reasoning.budget_tokens = fields.opt_int(
            thinking, "budget_tokens", "thinking.budget_tokens", 1, 10**9
        )
        if reasoning.mode == "enabled" and reasoning.budget_tokens is None:
            raise MalformedRequest(
                "thinking.budget_tokens is required", param="thinking.budget_tokens"
            )
        reasoning.display = fields.opt_choice(
            thinking, "display", "thinking.display", ("summarized", "omitted")
        )
    return reasoning


def _parse_output_format(data: dict[str, Any]) -> internal.ResponseFormat | None:
    config = fields.opt_obj(data, "output_config", "output_config")
    spec = None if config is None else fields.opt_obj(config, "format", "output_config.format")
    if spec is None:
        return None
    if spec.get("type") != "json_schema":
        raise MalformedRequest(
            "output_config.format.type must be json_schema", param="output_config.format.type"
        )
    schema = fields.required_obj(spec, "schema", "output_config.format.schema")
    return internal.ResponseFormat("json_schema", schema=schema)
