"""Forwarded operations: bodies the gateway passes through without reading their answers as
JSON chat. ``POST /v1/audio/speech`` (JSON in, audio bytes out) and the multipart uploads
``/v1/audio/transcriptions``, ``/v1/audio/translations`` and ``/v1/images/edits``.

They share every stage of the pipeline (auth, routing, limits, retries, fallbacks, usage
records, errors) but how the body is read and sent: an upload is authenticated first, then
read only up to its text fields (``api/multipart.py``: the model routes it), and streamed to
the provider with the model replaced, within ``SWITCHYARD_MAX_UPLOAD_BYTES``. The file is read
once: a provider that fails after it started receiving it ends the request (no other
candidate can be sent it); one that could not be reached at all is retried and falls back as
usual. Providers that do not offer the operation (Anthropic, the local engine) are passed
over.

Metering: the usage the provider reports (``usage`` with ``input_tokens``/``output_tokens``:
gpt-image-1, gpt-4o-transcribe); otherwise the typical estimate, recorded as
``estimated`` (text fields at four characters a token; speech: its input text alone).

Answers are relayed as the provider sent them. What the OpenAPI document says of a
transcription's or translation's in JSON is ``Transcription`` (OpenAI's shape, which the
gateway does not check); an image edit answers as a generation does (``openai.py``
``ImageList``).
"""

from __future__ import annotations

from typing import Any, TypedDict

from starlette.requests import Request

from gateway.api.http import JSON, read_body
from gateway.api.multipart import Upload, boundary_of, read_head
from gateway.api.strict_json import parse_json_object
from gateway.api.v1.doors import IMAGE_EDITS, TRANSCRIPTIONS, TRANSLATIONS, Door
from gateway.api.v1.pipeline import V1Pipeline, door_route
from gateway.api.v1.request_end import Call, Reply
from gateway.errors import InvalidRequest, PayloadTooLarge
from gateway.metering.attribution import take_attribution
from gateway.providers.attempt import ForwardAttempt, JsonPayload


class Transcription(TypedDict):
    """A transcription or translation as JSON (``response_format`` json or verbose_json)."""

    text: str


async def answer_speech(v1: V1Pipeline, call: Call, door: Door) -> Reply:
    """``POST /v1/audio/speech``: JSON in, the provider's audio bytes out."""
    request, books = call.request, call.books
    body = await read_body(request, v1.max_body_bytes)
    principal = await v1.authenticate(call)
    raw = parse_json_object(body)
    books.attribution = take_attribution(raw, request.headers, principal.record.tags)
    door.check(raw)
    plan, policy = v1.plan(books, raw, principal, door, request.headers)
    await v1.reserve(call, raw, principal, plan, policy, None)
    attempt = ForwardAttempt(
        v1.upstreams(call, policy), door.path, door.format, JSON, JsonPayload(raw)
    )
    result = await v1.dispatcher.run(plan, attempt)
    return v1.answered(call, door, plan, result)


async def answer_upload(v1: V1Pipeline, call: Call, door: Door) -> Reply:
    """A multipart upload: its head read for the model, the rest streamed on."""
    request, books = call.request, call.books
    cap = v1.max_upload_bytes
    principal = await v1.authenticate(call)  # before a byte of the upload is read
    boundary = boundary_of(request.headers.get("content-type"))
    declared = _declared_length(request, cap)
    head, rest = await read_head(request.stream(), boundary, cap)
    raw = _fields(head.fields, head.has_file)
    # The form's ``user`` field, or the headers.
    books.attribution = take_attribution(raw, request.headers, principal.record.tags)
    plan, policy = v1.plan(books, raw, principal, door, request.headers)
    await v1.reserve(call, raw, principal, plan, policy, None)
    upload = Upload(head, rest, cap=cap, declared_length=declared)
    content_type = request.headers["content-type"]
    attempt = ForwardAttempt(
        v1.upstreams(call, policy), door.path, door.format, content_type, upload
    )
    result = await v1.dispatcher.run(plan, attempt)
    return v1.answered(call, door, plan, result)


def _declared_length(request: Request, cap: int) -> int | None:
    declared = request.headers.get("content-length")
    if declared is None:
        return None
    if not declared.isdigit():
        raise InvalidRequest("Content-Length must be a number", param="content-length")
    if int(declared) > cap:
        raise PayloadTooLarge(f"the upload is larger than the limit of {cap} bytes")
    return int(declared)


def _fields(fields: dict[str, str], has_file: bool) -> dict[str, Any]:
    """The form's text fields as the body routing and the estimate read; model required."""
    model = fields.get("model")
    if not model:
        raise InvalidRequest("model is required (a form field sent before the file)", param="model")
    if not has_file:
        raise InvalidRequest("the upload has no file part", param="file")
    return dict(fields)


routes = [
    door_route(door, answer_upload, " (multipart/form-data)")
    for door in (TRANSCRIPTIONS, TRANSLATIONS, IMAGE_EDITS)
]
