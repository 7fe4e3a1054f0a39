"""Error envelopes: each format's own shape for every error kind, upstream errors parsed into one
record (with the codes routing acts on) and shown to a client in the client's format."""

from __future__ import annotations

import orjson
import pytest
from anthropic.types.shared import ErrorResponse
from fmt_support import check_error

from gateway.formats import FORMAT_NAMES, wire_format
from gateway.formats.errors import (
    CONTENT_FILTER,
    CONTEXT_LENGTH_EXCEEDED,
    ErrorInfo,
    MalformedRequest,
    Untranslatable,
    UpstreamProtocolError,
    kind_for_status,
)

ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


@pytest.mark.parametrize(("status", "error_type"), ANTHROPIC_TYPES.items())
def test_anthropic_envelope_uses_anthropic_types(status: int, error_type: str) -> None:
    body = wire_format("anthropic_messages").render_error(ErrorInfo.for_status(status, "nope"))
    assert body == {"type": "error", "error": {"type": error_type, "message": "nope"}}
    if error_type != "request_too_large":  # documented by Anthropic, absent from the SDK's union
        ErrorResponse.model_validate(body)


@pytest.mark.parametrize("name", ["openai_chat", "openai_responses"])
@pytest.mark.parametrize(
    ("status", "error_type", "code"),
    [
        (400, "invalid_request_error", None),
        (401, "invalid_request_error", "invalid_api_key"),
        (404, "invalid_request_error", "not_found"),
        (429, "rate_limit_exceeded", "rate_limit_exceeded"),
        (500, "server_error", None),
        (529, "service_unavailable", "service_unavailable"),
    ],
)
def test_openai_envelope(name: str, status: int, error_type: str, code: str | None) -> None:
    body = wire_format(name).render_error(ErrorInfo.for_status(status, "nope"))  # type: ignore[arg-type]
    check_error(name, body)  # type: ignore[arg-type]
    assert body["error"] == {"message": "nope", "type": error_type, "param": None, "code": code}


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_bad_input_renders_with_the_field(name: str) -> None:
    with pytest.raises(MalformedRequest) as caught:
        wire_format(name).parse_request(
            {"model": "m", "messages": "hi", "input": 3, "max_tokens": 5}
        )  # type: ignore[arg-type]
    body = wire_format(name).render_error(caught.value.info())  # type: ignore[arg-type]
    check_error(name, body)  # type: ignore[arg-type]
    field = "input" if name == "openai_responses" else "messages"
    if name == "anthropic_messages":
        assert (
            field in body["error"]["message"] and body["error"]["type"] == "invalid_request_error"
        )
    else:
        assert body["error"]["param"] == field


def test_untranslatable_renders_as_400_with_code() -> None:
    error = Untranslatable("top_k", "OpenAI Chat Completions", "no top_k there")
    body = wire_format("anthropic_messages").render_error(error.info())
    assert error.status == 400 and body["error"]["type"] == "invalid_request_error"
    body = wire_format("openai_chat").render_error(error.info())
    assert body["error"]["code"] == "unsupported_parameter" and body["error"]["param"] == "top_k"
    assert UpstreamProtocolError("x").info().status == 502


PARSED = [
    (
        "anthropic_messages",
        400,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 210417 tokens > 200000 maximum",
            },
        },
        ("invalid_request", CONTEXT_LENGTH_EXCEEDED),
    ),
    (
        "anthropic_messages",
        529,
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        ("overloaded", None),
    ),
    (
        "anthropic_messages",
        429,
        {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}},
        ("rate_limit", None),
    ),
    (
        "openai_chat",
        400,
        {
            "error": {
                "message": "This model's maximum context length is 128000 tokens.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
        ("invalid_request", CONTEXT_LENGTH_EXCEEDED),
    ),
    (
        "openai_chat",
        400,
        {
            "error": {
                "message": "The response was filtered",
                "type": None,
                "param": "prompt",
                "code": "content_filter",
                "status": 400,
            }
        },
        ("invalid_request", CONTENT_FILTER),
    ),
    (
        "openai_responses",
        429,
        {
            "error": {
                "message": "You exceeded your quota",
                "type": "insufficient_quota",
                "param": None,
                "code": "insufficient_quota",
            }
        },
        ("billing", "insufficient_quota"),
    ),
]


@pytest.mark.parametrize(("name", "status", "body", "expected"), PARSED)
def test_upstream_errors_parse_into_one_record(
    name: str, status: int, body: dict, expected: tuple
) -> None:
    info = wire_format(name).parse_error(status, orjson.dumps(body))  # type: ignore[arg-type]
    assert (info.kind, info.code) == expected
    assert info.status == status and info.message
    # ... and show in every client format.
    for target in FORMAT_NAMES:
        check_error(target, wire_format(target).render_error(info))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_unreadable_error_bodies(name: str) -> None:
    info = wire_format(name).parse_error(502, b"<html>Bad Gateway</html>")  # type: ignore[arg-type]
    assert info == ErrorInfo(502, "upstream returned HTTP 502", "api_error")


def test_kind_for_status_defaults() -> None:
    assert kind_for_status(418) == "invalid_request"
    assert kind_for_status(503) == "overloaded"
    assert kind_for_status(599) == "api_error"


def test_anthropic_openai_error_translation_keeps_meaning() -> None:
    upstream = {"type": "error", "error": {"type": "permission_error", "message": "no access"}}
    info = wire_format("anthropic_messages").parse_error(403, upstream)
    body = wire_format("openai_chat").render_error(info)
    assert body["error"] == {
        "message": "no access",
        "type": "invalid_request_error",
        "param": None,
        "code": "permission_denied",
    }
