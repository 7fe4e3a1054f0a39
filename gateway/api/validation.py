"""Checks of /v1 request bodies: enough of OpenAI's schema to reject bad input with the field.

Unknown fields pass through untouched (providers add their own); known fields must have the
right type, and the error names the offending path (``messages[2].role``).
"""

from __future__ import annotations

from typing import Any

from gateway.errors import InvalidRequest

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int_field(body: dict[str, Any], name: str, low: int, high: int) -> None:
    value = body.get(name)
    if value is None:
        return
    if not _is_int(value) or not low <= value <= high:
        raise InvalidRequest(f"{name} must be an integer from {low} to {high}", param=name)


def _number_field(body: dict[str, Any], name: str, low: float, high: float) -> None:
    value = body.get(name)
    if value is None:
        return
    if not _is_number(value) or not low <= value <= high:
        raise InvalidRequest(f"{name} must be a number from {low} to {high}", param=name)


def _bool_field(body: dict[str, Any], name: str) -> None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be a boolean", param=name)


def _model_field(body: dict[str, Any], required: bool) -> None:
    model = body.get("model")
    if model is None and not required:
        return
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model must be a non-empty string", param="model")


def _stream_fields(body: dict[str, Any]) -> None:
    _bool_field(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return
    if not isinstance(options, dict):
        raise InvalidRequest("stream_options must be an object", param="stream_options")
    include = options.get("include_usage")
    if include is not None and not isinstance(include, bool):
        raise InvalidRequest(
            "stream_options.include_usage must be a boolean", param="stream_options.include_usage"
        )
    if not body.get("stream"):
        raise InvalidRequest(
            "stream_options is only allowed when stream is true", param="stream_options"
        )


def _sampling_fields(body: dict[str, Any]) -> None:
    _int_field(body, "max_tokens", 1, 10_000_000)
    _int_field(body, "max_completion_tokens", 1, 10_000_000)
    _int_field(body, "n", 1, 128)
    _number_field(body, "temperature", 0, 2)
    _number_field(body, "top_p", 0, 1)
    _number_field(body, "presence_penalty", -2, 2)
    _number_field(body, "frequency_penalty", -2, 2)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str | list):
        raise InvalidRequest("stop must be a string or a list of strings", param="stop")
    if isinstance(stop, list) and not all(isinstance(item, str) for item in stop):
        raise InvalidRequest("stop must be a string or a list of strings", param="stop")


def validate_chat(body: dict[str, Any]) -> None:
    _model_field(body, required=False)  # no model = route by task
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty array", param="messages")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise InvalidRequest(f"{where} must be an object", param=where)
        role = message.get("role")
        if role not in ROLES:
            raise InvalidRequest(
                f"{where}.role must be one of {', '.join(sorted(ROLES))}", param=f"{where}.role"
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise InvalidRequest(
                f"{where}.content must be a string or an array of parts",
                param=f"{where}.content",
            )
        if content is None and role in ("user", "system", "developer"):
            raise InvalidRequest(f"{where}.content is required", param=f"{where}.content")
    _stream_fields(body)
    _sampling_fields(body)


def validate_completion(body: dict[str, Any]) -> None:
    _model_field(body, required=False)
    prompt = body.get("prompt")
    if not isinstance(prompt, str | list) or (isinstance(prompt, list) and not prompt):
        raise InvalidRequest("prompt must be a string or a non-empty array", param="prompt")
    _stream_fields(body)
    _sampling_fields(body)


def validate_embedding(body: dict[str, Any]) -> None:
    _model_field(body, required=True)
    value = body.get("input")
    if isinstance(value, str):
        if not value:
            raise InvalidRequest("input must not be empty", param="input")
    elif not isinstance(value, list) or not value:
        raise InvalidRequest("input must be a string or a non-empty array", param="input")
    if body.get("stream"):
        raise InvalidRequest("embeddings cannot be streamed", param="stream")


def validate_image(body: dict[str, Any]) -> None:
    _model_field(body, required=True)
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise InvalidRequest("prompt must be a non-empty string", param="prompt")
    _int_field(body, "n", 1, 10)
    if body.get("stream"):
        raise InvalidRequest("image generation is not streamed by this gateway", param="stream")
