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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.doors import Door
from gateway.api.endpoint import door_route
from gateway.api.http import read_body
from gateway.api.multipart import Upload, boundary_of, read_head
from gateway.api.pipeline import (
    AttemptReply,
    Upstream,
    answered,
    attribute,
    authenticate,
    plan_route,
    reserve,
    run,
)
from gateway.api.request_end import V1Call
from gateway.api.strict_json import parse_json_object
from gateway.api.translation import Answer
from gateway.errors import InvalidRequest, PayloadTooLarge, UpstreamError
from gateway.formats.openai_chat.relay import chat_usage
from gateway.metering.gate import Usage
from gateway.policy import operations
from gateway.providers.base import RawReply, unsupported
from gateway.routing.router import Candidate
from gateway.services import Services


def _unchecked(body: dict[str, Any]) -> None:
    return None


TRANSCRIPTIONS = Door(
    "audio.transcriptions",
    "/audio/transcriptions",
    "openai_chat",
    _unchecked,
    operation=operations.TRANSCRIPTION,
)
TRANSLATIONS = Door(
    "audio.translations",
    "/audio/translations",
    "openai_chat",
    _unchecked,
    operation=operations.TRANSCRIPTION,
)
IMAGE_EDITS = Door(
    "images.edits", "/images/edits", "openai_chat", _unchecked, operation=operations.IMAGES
)


def speaks_openai(candidate: Candidate, upstream: Upstream, door: Door) -> None:
    """These operations are OpenAI's: a provider of another format does not offer them."""
    if door.format not in upstream.provider.formats:
        raise unsupported(candidate.provider, door.path, f"it does not speak {door.format}")


def reply_answer(reply: RawReply) -> Answer:
    """The provider's bytes as they came, and the usage they report (JSON answers only)."""
    usage: Usage | None = None
    if reply.content_type.lower().startswith("application/json"):
        try:
            data = orjson.loads(reply.body)
        except orjson.JSONDecodeError:
            data = None
        found = data.get("usage") if isinstance(data, dict) else None
        if isinstance(found, dict):
            usage = Usage.of(chat_usage(found))
    return Answer(reply.body, usage)


async def handle_speech(request: Request, services: Services, door: Door) -> Response:
    async def pipeline(call: V1Call) -> Response:
        body = await read_body(call.request, call.services.settings.max_body_bytes)
        principal = await authenticate(call)
        raw = parse_json_object(body)
        attribute(call, raw, principal)
        door.check(raw)
        plan = plan_route(call, raw, principal, door)
        await reserve(call, raw, principal, plan)

        async def attempt(candidate: Candidate) -> AttemptReply:
            upstream = Upstream(call, candidate)
            speaks_openai(candidate, upstream, door)
            sent = orjson.dumps({**raw, "model": candidate.upstream_model})
            reply = await upstream.provider.forward(
                door.path,
                sent,
                model=candidate.upstream_model,
                content_type="application/json",
                content_length=len(sent),
                headers=upstream.headers,
            )
            return AttemptReply(
                answer=reply_answer(reply),
                reply_type=reply.content_type,
                route_note=reply.route_note,
            )

        result = await call.services.dispatcher.run(plan, attempt)
        return answered(call, plan, result, door)

    return await run(request, services, door, pipeline)


async def handle_upload(request: Request, services: Services, door: Door) -> Response:
    async def pipeline(call: V1Call) -> Response:
        settings = call.services.settings
        cap = settings.max_upload_bytes
        principal = await authenticate(call)  # before a byte of the upload is read
        boundary = boundary_of(call.request.headers.get("content-type"))
        declared = _declared_length(call.request, cap)
        head, rest = await read_head(call.request.stream(), boundary, cap)
        raw = _fields(head.fields, head.has_file)
        attribute(call, raw, principal)  # the form's ``user`` field, or the headers
        plan = plan_route(call, raw, principal, door)
        await reserve(call, raw, principal, plan)
        upload = Upload(head, rest, cap=cap, declared_length=declared)
        result = await call.services.dispatcher.run(plan, _upload_attempt(call, door, upload))
        return answered(call, plan, result, door)

    return await run(request, services, door, pipeline)


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


def _upload_attempt(
    call: V1Call, door: Door, upload: Upload
) -> Callable[[Candidate], Awaitable[AttemptReply]]:
    async def attempt(candidate: Candidate) -> AttemptReply:
        upstream = Upstream(call, candidate)
        speaks_openai(candidate, upstream, door)
        model = candidate.upstream_model
        if upload.started:
            raise UpstreamError(
                "the upload was already sent to another provider and cannot be sent again",
                status=502,
                retryable=False,
                kind="spent",
                provider=candidate.provider,
                final=True,
            )
        try:
            reply = await upstream.provider.forward(
                door.path,
                upload.body(model),
                model=model,
                content_type=call.request.headers["content-type"],
                content_length=upload.length(model),
                headers=upstream.headers,
            )
        except Exception as exc:
            if upload.too_large:  # however the HTTP client reported the generator's refusal
                raise UpstreamError(
                    f"the upload is larger than the limit of {upload.cap} bytes",
                    status=413,
                    retryable=False,
                    kind="status",
                    code="request_too_large",
                    error_type="invalid_request_error",
                    final=True,
                ) from None
            if isinstance(exc, UpstreamError) and upload.started:
                exc.retryable, exc.final = False, True  # the file went (partly) to this one
            raise
        return AttemptReply(
            answer=reply_answer(reply), reply_type=reply.content_type, route_note=reply.route_note
        )

    return attempt


routes = [
    door_route(door, handle_upload, " (multipart/form-data)")
    for door in (TRANSCRIPTIONS, TRANSLATIONS, IMAGE_EDITS)
]
