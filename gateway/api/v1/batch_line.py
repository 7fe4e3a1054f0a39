"""A batch's line through the /v1 pipeline: the ``LineRunner`` the batch runner is given.

``line_runner(pipeline)`` returns the one function that runs a line as a request of the
batch's key at the batch's endpoint: ``V1Pipeline.serve`` with ``answer_line`` as the door's
answering, so the line passes the same stages as ``V1Pipeline.answer`` (check at the door,
plan, reserve, dispatch with retries and fallbacks) and ends the same way (``Calls.deliver``:
settle and usage record, access line, metrics), less reading a body and a credential: the key
is the batch's, looked up by id and refused as an interactive request would be once it is
revoked or expired. The usage event is tagged ``batch:<id>`` beside the key's tags and priced
at the models' batch prices. The answer is what an interactive client would have got: status,
body (the door's error envelope for a refusal) and usage. Streams are refused (a batch line
has no one to stream to), and the response cache is left alone.

This file is the seam between the batch part and the pipeline: everything the batch runner
knows of the pipeline is ``LineRunner`` (``gateway/batches/lines.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from gateway.access.auth import Principal
from gateway.api.v1.doors import CHAT, COMPLETIONS, EMBEDDINGS, MESSAGES, RESPONSES, Door
from gateway.api.v1.pipeline import V1Pipeline
from gateway.api.v1.request_end import Call, Reply
from gateway.batches.lines import LineCall, LineResult, LineRunner
from gateway.errors import InvalidRequest
from gateway.formats.translation import Translation
from gateway.ledger.event import MAX_TAGS
from gateway.metering.attribution import Attribution, batch_tag, take_attribution
from gateway.providers.attempt import JsonAttempt

DOORS: dict[str, Door] = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETIONS,
    "/v1/embeddings": EMBEDDINGS,
    "/v1/responses": RESPONSES,
    "/v1/messages": MESSAGES,
}


def line_runner(pipeline: V1Pipeline) -> LineRunner:
    async def run(line: LineCall) -> LineResult:
        return await run_line(pipeline, line)

    return run


def line_request(door: Door, request_id: str) -> Request:
    """A request of no client: what the pipeline's stages read of one (no body: the line's
    is handed over parsed; no disconnect: nobody hangs up on a batch)."""

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # never set: the local engine waits on it for a hang-up
        return {"type": "http.disconnect"}

    scope = {
        "type": "http",
        "method": "POST",
        "path": f"/v1{door.path}",
        "raw_path": f"/v1{door.path}".encode(),
        "query_string": b"",
        "headers": [(b"x-request-id", request_id.encode())],
        "client": None,
        "state": {},
    }
    return Request(scope, receive)


async def run_line(pipeline: V1Pipeline, line: LineCall) -> LineResult:
    """``line`` from its start to its end, answered or refused (a refusal has no usage), its
    usage durable before it returns. Called back (cancelled: the local engine is wanted, or
    shutdown), it ends as a request whose client went away, and the cancellation goes on."""
    door = DOORS[line.endpoint]
    answered: list[Reply] = []

    async def answering(pipeline: V1Pipeline, call: Call, door: Door) -> Reply:
        reply = await answer_line(pipeline, call, door, line)
        answered.append(reply)
        return reply

    response = await pipeline.serve(line_request(door, line.request_id), door, answering)
    usage = answered[0].usage if answered else None
    headers = response.headers
    retry_after = headers.get("retry-after")
    return LineResult(
        status=response.status_code,
        body=bytes(response.body),
        prompt_tokens=usage.prompt_tokens if usage else 0,
        completion_tokens=usage.completion_tokens if usage else 0,
        retry_after_s=float(retry_after) if retry_after and retry_after.isdigit() else None,
        should_retry=headers.get("x-should-retry") != "false",
    )


async def answer_line(pipeline: V1Pipeline, call: Call, door: Door, line: LineCall) -> Reply:
    """``V1Pipeline.answer`` for a line: the batch's key in place of a credential, the line's
    body in place of reading one, no stream and no response cache; priced as a batch's."""
    books, headers = call.books, call.request.headers
    principal = await pipeline.auth.principal_of(line.key_id)
    books.key_id, books.team = principal.key_id, principal.record.team or ""
    checked = checked_line(door, line, principal, headers)
    books.attribution, books.batch = checked.attribution, True
    raw, translation = checked.raw, checked.translation
    plan, policy = pipeline.plan(books, raw, principal, door, headers)
    await pipeline.reserve(call, raw, principal, plan, policy, None)
    attempt = JsonAttempt(pipeline.upstreams(call, policy), translation, call.request.receive)
    result = await pipeline.dispatcher.run(plan, attempt)
    return pipeline.answered(call, door, plan, result)


@dataclass(frozen=True, slots=True)
class CheckedLine:
    """A line's body as its door took it: the body (its tags taken out), its attribution,
    its translation."""

    raw: dict[str, Any]
    attribution: Attribution
    translation: Translation


def checked_line(
    door: Door, line: LineCall, principal: Principal, headers: Mapping[str, str]
) -> CheckedLine:
    """What every line passes at the door, whoever runs it (the pipeline, or a provider's
    batch API): no stream, its tags (and the batch's), its body checked; ``GatewayError``
    as the pipeline refuses it."""
    raw = dict(line.body)
    if door.streamable and raw.get("stream") is True:
        raise InvalidRequest("stream: a batch's requests cannot stream", param="stream")
    attribution = line_attribution(raw, headers, principal.record.tags, line.batch_id)
    return CheckedLine(raw, attribution, Translation(door.client_side, raw, door.check(raw)))


def line_attribution(
    raw: dict[str, Any], headers: Mapping[str, str], key_tags: tuple[str, ...] | None, batch_id: str
) -> Attribution:
    """The line's end user and tags, and the batch's own tag beside them."""
    found = take_attribution(raw, headers, key_tags)
    tags = (*found.tags, batch_tag(batch_id))
    if len(tags) > MAX_TAGS:
        raise InvalidRequest(
            f"metadata.tags: a batch's request may carry at most {MAX_TAGS - 1} tags "
            "(the batch's own tag takes the last place)",
            param="metadata.tags",
        )
    return Attribution(end_user=found.end_user, tags=tags)
