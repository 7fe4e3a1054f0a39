"""OpenTelemetry GenAI semantic-convention attributes from OpenAI-format requests and answers.

Names follow the GenAI client-inference conventions (development status; the names used here
are those of semantic-conventions 1.37+ and the semantic-conventions-genai registry:
``gen_ai.provider.name`` replaced ``gen_ai.system``). Only the fields of a request are read,
never its text: ``gen_ai.input.messages`` / ``gen_ai.output.messages`` (the opt-in content
attributes, JSON in the conventions' parts format) are built only when prompt capture is on.
A value of the wrong type is left out rather than guessed: the body was validated already, and
a trace must never fail a request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

# The conventions' operation names, by the gateway's route name.
OPERATIONS = {
    "chat.completions": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
    "images.generations": "generate_content",
    "messages": "chat",
    "responses": "chat",
}

OPERATION_NAME = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_ID = "gen_ai.response.id"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"

# body field -> attribute, for numbers
_NUMBERS = {
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
}


def operation_of(route: str) -> str:
    return OPERATIONS.get(route, route)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | int | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return None


def request_attributes(route: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """``gen_ai.request.*`` of one request (sampling and shape; never its content)."""
    attributes: dict[str, Any] = {OPERATION_NAME: operation_of(route)}
    model = body.get("model")
    if isinstance(model, str):
        attributes[REQUEST_MODEL] = model
    for field, name in _NUMBERS.items():
        value = _number(body.get(field))
        if value is not None:
            attributes[name] = value
    max_tokens = _int(body.get("max_completion_tokens", body.get("max_tokens")))
    if max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = max_tokens
    seed = _int(body.get("seed"))
    if seed is not None:
        attributes["gen_ai.request.seed"] = seed
    n = _int(body.get("n"))
    if n is not None and n != 1:
        attributes["gen_ai.request.choice.count"] = n
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, list) and all(isinstance(item, str) for item in stop):
        attributes["gen_ai.request.stop_sequences"] = stop
    if isinstance(body.get("stream"), bool):
        attributes["gen_ai.request.stream"] = body["stream"]
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and isinstance(response_format.get("type"), str):
        kind = response_format["type"]
        attributes["gen_ai.output.type"] = "json" if kind.startswith("json") else kind
    encoding = body.get("encoding_format")
    if isinstance(encoding, str):
        attributes["gen_ai.request.encoding_formats"] = [encoding]
    return attributes


def usage_attributes(usage: Mapping[str, Any]) -> dict[str, int]:
    """``gen_ai.usage.*`` from an OpenAI ``usage`` object."""
    attributes: dict[str, int] = {}
    prompt = _int(usage.get("prompt_tokens"))
    if prompt is not None:
        attributes[INPUT_TOKENS] = prompt
    completion = _int(usage.get("completion_tokens"))
    if completion is not None:
        attributes[OUTPUT_TOKENS] = completion
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
    if cached:
        attributes[CACHE_READ_TOKENS] = cached
    return attributes


# Prompt capture (opt-in) -------------------------------------------------------------------


def _parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts: list[dict[str, Any]] = []
    if isinstance(content, list):
        for item in content:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "text" and isinstance(item.get("text"), str):
                parts.append({"type": "text", "content": item["text"]})
            elif isinstance(item.get("type"), str):  # images, audio, files: named, not copied
                parts.append({"type": item["type"]})
    return parts


def _tool_calls(calls: Any) -> list[dict[str, Any]]:
    parts = []
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("id"),
                    "name": function.get("name"),
                    "arguments": function.get("arguments"),
                }
            )
    return parts


def _message(message: Any) -> dict[str, Any] | None:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        return None
    role = message["role"]
    if role == "tool":
        part = {"type": "tool_call_response", "id": message.get("tool_call_id")}
        part["response"] = message.get("content")
        return {"role": "tool", "parts": [part]}
    parts = _parts(message.get("content")) + _tool_calls(message.get("tool_calls"))
    return {"role": role, "parts": parts}


def input_messages(body: Mapping[str, Any]) -> str | None:
    """``gen_ai.input.messages`` (JSON) of a chat or text-completion request."""
    messages = body.get("messages")
    if isinstance(messages, list):
        converted = [m for m in (_message(message) for message in messages) if m is not None]
        return orjson.dumps(converted).decode()
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompt = [prompt]
    if isinstance(prompt, list) and all(isinstance(item, str) for item in prompt):
        converted = [{"role": "user", "parts": _parts(item)} for item in prompt]
        return orjson.dumps(converted).decode()
    return None


def output_messages(choices: list[tuple[str, str | None]]) -> str:
    """``gen_ai.output.messages`` (JSON) of (text, finish reason) per choice."""
    converted = [
        {"role": "assistant", "parts": _parts(text), "finish_reason": reason or ""}
        for text, reason in choices
    ]
    return orjson.dumps(converted).decode()
