"""Checks of /v1 request bodies against the typed models of ``request_models``.

The body stays the dict the client sent: it is checked, never rebuilt, so unknown fields and
known fields the gateway does not read reach the provider untouched. A failure is a 400 in
OpenAI's envelope whose ``param`` is the field path (``messages[2].role``) and whose message
says what was expected; no client value longer than a few words is echoed.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from gateway.api.v1.request_models import (
    ROLES,
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    ImageRequest,
    ModerationRequest,
    RouteRequest,
    SpeechRequest,
)
from gateway.errors import InvalidRequest

__all__ = [
    "ROLES",
    "validate_chat",
    "validate_completion",
    "validate_embedding",
    "validate_image",
    "validate_moderation",
    "validate_routed",
    "validate_speech",
]

_TYPE_NAMES = {
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "dict": "object",
    "object": "object",
    "array": "array",
    "null": "null",
}
_TYPES = re.compile(r"`([^`]*)`")
_MISSING = re.compile(r"Object missing required field `([^`]*)`")
# Where a value is one of a fixed set, the set (msgspec's own text would echo the value).
_ALLOWED = {"role": ", ".join(ROLES)}


def _plain_types(match: re.Match[str]) -> str:
    return " or ".join(_TYPE_NAMES.get(name.strip(), name.strip()) for name in match[1].split("|"))


def _join(path: str, field: str) -> str:
    return f"{path}.{field}" if path and field else path or field


def invalid_body(error: msgspec.ValidationError, prefix: str = "") -> InvalidRequest:
    """msgspec's error (``Expected `int`, got `str` - at `$.n```) as a 400 naming the path,
    under ``prefix`` when the body sits inside another document."""
    text = str(error)
    detail, marker, where = text.rpartition(" - at `$")
    if not marker:
        detail, where = text, "`"
    path = _join(prefix, where[:-1].removeprefix(".")) if prefix else where[:-1].removeprefix(".")
    missing = _MISSING.match(detail)
    if missing:
        path, message = _join(path, missing[1]), "is required"
    elif detail.startswith(("Invalid enum value", "Invalid value")):
        field = path.rpartition(".")[2]
        allowed = _ALLOWED.get(field)
        message = f"must be one of {allowed}" if allowed else "is not an allowed value"
    else:
        message = _TYPES.sub(_plain_types, detail)
        message = message[:1].lower() + message[1:]
    if not path:
        return InvalidRequest(f"the request body: {message}")
    return InvalidRequest(f"{path}: {message}", param=path)


def _convert(body: dict[str, Any], model: type[Any], prefix: str = "") -> Any:
    try:
        return msgspec.convert(body, model, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid_body(exc, prefix) from None


def _stream_options_need_stream(request: ChatCompletionRequest | CompletionRequest) -> None:
    if request.stream_options is not None and request.stream is not True:
        raise InvalidRequest(
            "stream_options: only allowed when stream is true", param="stream_options"
        )


def validate_chat(body: dict[str, Any]) -> None:
    request: ChatCompletionRequest = _convert(body, ChatCompletionRequest)
    _stream_options_need_stream(request)


def validate_completion(body: dict[str, Any]) -> None:
    request: CompletionRequest = _convert(body, CompletionRequest)
    _stream_options_need_stream(request)


def validate_embedding(body: dict[str, Any]) -> None:
    request: EmbeddingRequest = _convert(body, EmbeddingRequest)
    if request.stream:
        raise InvalidRequest("stream: embeddings cannot be streamed", param="stream")


def validate_image(body: dict[str, Any]) -> None:
    request: ImageRequest = _convert(body, ImageRequest)
    if request.stream:
        raise InvalidRequest(
            "stream: image generation is not streamed by this gateway", param="stream"
        )


def validate_moderation(body: dict[str, Any]) -> None:
    _convert(body, ModerationRequest)


def validate_speech(body: dict[str, Any]) -> None:
    request: SpeechRequest = _convert(body, SpeechRequest)
    if request.stream:
        raise InvalidRequest("stream: speech is relayed whole by this gateway", param="stream")


def validate_routed(body: dict[str, Any], prefix: str) -> None:
    """The fields routing reads, in any /v1 body (the route explanation's ``body``)."""
    _convert(body, RouteRequest, prefix)
