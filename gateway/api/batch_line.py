"""A batch's line through the interactive pipeline: the ``LineRunner`` the batch runner is given.

``line_runner(services)`` returns the one function that runs a line as a request of the batch's
key at the batch's endpoint: the same stages as ``api/pipeline.py`` (check at the door, plan,
reserve, dispatch with retries and fallbacks, the request's end: settle and usage record, access
line, metrics), less reading a body and a bearer: the key is the batch's, looked up by id and
refused as an interactive request would be once it is revoked or expired. The usage event is
tagged ``batch:<id>`` beside the key's tags and priced at the models' batch prices. The answer
is what an interactive client would have got: status, body (the door's error envelope for a
refusal) and usage. Streams are refused (a batch line has no one to stream to), and the
response cache is left alone.

This file is the seam between the batch part and the pipeline: everything the batch runner
knows of the pipeline is ``LineRunner`` (``gateway/batches/lines.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request

from gateway.api.doors import CHAT, COMPLETIONS, EMBEDDINGS, MESSAGES, RESPONSES, Door
from gateway.api.pipeline import _json_attempt, answered, plan_route, refused, reserve
from gateway.api.request_end import V1Call, durable
from gateway.api.translation import Exchange
from gateway.batches.lines import LineCall, LineResult, LineRunner
from gateway.errors import GatewayError, InvalidRequest
from gateway.ledger.event import MAX_TAGS
from gateway.metering.attribution import Attribution, batch_tag, take_attribution
from gateway.server.exchange import CLIENT_GONE
from gateway.services import Services

DOORS: dict[str, Door] = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETIONS,
    "/v1/embeddings": EMBEDDINGS,
    "/v1/responses": RESPONSES,
    "/v1/messages": MESSAGES,
}


def line_runner(services: Services) -> LineRunner:
    async def run(line: LineCall) -> LineResult:
        return await run_line(services, line)

    return run


def _request(door: Door, request_id: str) -> Request:
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


async def run_line(services: Services, line: LineCall) -> LineResult:
    door = DOORS[line.endpoint]
    call = V1Call(_request(door, line.request_id), services, door.route)
    response = None
    try:
        principal = await services.auth.principal_of(line.key_id)
        call.outcome.key_id = principal.key_id
        raw = dict(line.body)
        if door.streamable and raw.get("stream") is True:
            raise InvalidRequest("stream: a batch's requests cannot stream", param="stream")
        call.attribution = _attributed(raw, call, principal.record.tags, line.batch_id)
        exchange = Exchange(door, raw, door.check(raw))
        plan = plan_route(call, raw, principal, door)
        assert call.books is not None
        call.books.batch = True
        await reserve(call, raw, principal, plan)
        result = await services.dispatcher.run(plan, _json_attempt(call, exchange))
        response = answered(call, plan, result, door)
    except GatewayError as exc:
        response = refused(call, door, exc)
    except asyncio.CancelledError:  # called back (the local engine is wanted), or shutdown
        call.outcome.status = CLIENT_GONE
        raise
    finally:
        recorded = call.end()
    await durable(recorded)  # answered once its usage is durable, as an interactive request
    usage = call.outcome.usage
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


def _attributed(
    raw: dict[str, Any], call: V1Call, key_tags: tuple[str, ...] | None, batch_id: str
) -> Attribution:
    """The line's end user and tags, and the batch's own tag beside them."""
    found = take_attribution(raw, call.request.headers, key_tags)
    tags = (*found.tags, batch_tag(batch_id))
    if len(tags) > MAX_TAGS:
        raise InvalidRequest(
            f"metadata.tags: a batch's request may carry at most {MAX_TAGS - 1} tags "
            "(the batch's own tag takes the last place)",
            param="metadata.tags",
        )
    return Attribution(end_user=found.end_user, tags=tags)
