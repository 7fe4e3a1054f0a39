"""OpenAI's Batch API, run by the gateway itself: ``POST /v1/batches``, ``GET /v1/batches``,
``GET /v1/batches/{id}`` and ``POST /v1/batches/{id}/cancel``.

A batch names an uploaded ``purpose=batch`` file of the caller's key and the endpoint every
line goes to (``/v1/chat/completions``, ``/v1/embeddings``, ``/v1/completions``,
``/v1/responses``); it starts ``validating`` and the runner (``gateway/batches/runner.py``) takes
it from there. Keys see only their own batches. A cancel is recorded in the store and marked in
Redis before it is answered: no line starts after it, lines already running finish and are kept.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.access.auth import Principal
from gateway.api.endpoint import Guard, endpoint
from gateway.api.http import json_response, read_json_object
from gateway.api.id_page import IdPage, id_page
from gateway.api.payloads import parse_payload, parse_query
from gateway.api.v1.batch_views import Batch, batch_view
from gateway.api.v1.files import owned_file
from gateway.batches.records import (
    COMPLETION_WINDOW,
    INPUT_PURPOSE,
    WINDOW_MS,
    BatchRecord,
    new_batch_id,
)
from gateway.errors import Conflict, InvalidRequest, NotFound, echo
from gateway.services import Services

MAX_BATCH_BODY_BYTES = 64 * 1024
OPENAI_ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/completions", "/v1/responses")

MetadataKey = Annotated[str, Field(min_length=1, max_length=64)]
MetadataValue = Annotated[str, Field(max_length=512)]


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_file_id: Annotated[str, Field(min_length=1, max_length=200)]
    endpoint: Literal[OPENAI_ENDPOINTS]  # type: ignore[valid-type]
    completion_window: Literal["24h"]
    metadata: Annotated[dict[MetadataKey, MetadataValue], Field(max_length=16)] | None = None


class BatchListQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limit: Annotated[int, Field(ge=1, le=100)] = 20
    after: (
        Annotated[str, Field(max_length=200, description="a batch id: the page after it")] | None
    ) = None


class BatchList(IdPage):
    object: Literal["list"]
    data: list[Batch]


async def owned_batch(services: Services, principal: Principal, batch_id: str) -> BatchRecord:
    record = await services.batches.store.batch(batch_id)
    if record is None or record.key_id != principal.key_id or record.api != "openai":
        raise NotFound(f"No batch found with id {echo(batch_id)}.", param="batch_id", code=None)
    return record


async def openai_view(services: Services, record: BatchRecord) -> Batch:
    return batch_view(record, await services.batches.store.counts(record.batch_id))


async def create_batch(request: Request, services: Services, principal: Principal) -> Response:
    """``POST /v1/batches``"""
    body = parse_payload(BatchCreate, await read_json_object(request, MAX_BATCH_BODY_BYTES))
    file = await owned_file(services, principal, body.input_file_id)
    if file.purpose != INPUT_PURPOSE:
        raise InvalidRequest(
            f"input_file_id: the file's purpose is {file.purpose!r}, not {INPUT_PURPOSE!r}",
            param="input_file_id",
        )
    now = int(time.time() * 1000)
    record = BatchRecord(
        batch_id=new_batch_id("openai"),
        key_id=principal.key_id,
        api="openai",
        endpoint=body.endpoint,
        input_file_id=file.file_id,
        completion_window=COMPLETION_WINDOW,
        metadata_json=orjson.dumps(body.metadata).decode() if body.metadata is not None else None,
        status="validating",
        created_ms=now,
        expires_ms=now + WINDOW_MS,
    )
    await services.batches.store.add_batch(record)
    return json_response(await openai_view(services, record))


async def list_batches(request: Request, services: Services, principal: Principal) -> Response:
    """``GET /v1/batches?limit=&after=``: the key's batches, newest first."""
    query = parse_query(BatchListQuery, request)
    after = await owned_batch(services, principal, query.after) if query.after else None
    page = await services.batches.store.batches(
        principal.key_id, api="openai", after=after, limit=query.limit
    )
    data = [await openai_view(services, record) for record in page.items]
    answer = BatchList(object="list", data=data, **id_page(data, page.has_more))
    return json_response(answer)


async def get_batch(request: Request, services: Services, principal: Principal) -> Response:
    """``GET /v1/batches/{batch_id}``"""
    record = await owned_batch(services, principal, request.path_params["batch_id"])
    return json_response(await openai_view(services, record))


async def cancel_recorded(services: Services, record: BatchRecord) -> BatchRecord:
    """Cancel ``record`` (its lines stop starting at once) and return it as it is now; a batch
    already cancelling or cancelled is returned as it is, a finished one refused."""
    batches = services.batches
    if await batches.store.cancel(record.batch_id, int(time.time() * 1000)):
        try:
            await batches.cancels.mark(record.batch_id)
        except Exception as exc:  # the store has it: runners also stop at their next claim
            services.log.warning("batch_cancel_mark_failed", error=type(exc).__name__)
    current = await batches.store.batch(record.batch_id)
    assert current is not None
    if current.status not in ("cancelling", "cancelled"):
        raise Conflict(
            f"Cannot cancel a batch whose status is {current.status!r}.",
            code="batch_not_cancellable",
        )
    return current


async def cancel_batch(request: Request, services: Services, principal: Principal) -> Response:
    """``POST /v1/batches/{batch_id}/cancel``: ``cancelling``, then ``cancelled`` once no line
    runs any more."""
    record = await owned_batch(services, principal, request.path_params["batch_id"])
    return json_response(await openai_view(services, await cancel_recorded(services, record)))


routes = [
    Route("/v1/batches", endpoint(create_batch, Guard.API_KEY), methods=["POST"]),
    Route("/v1/batches", endpoint(list_batches, Guard.API_KEY), methods=["GET"]),
    Route("/v1/batches/{batch_id}", endpoint(get_batch, Guard.API_KEY), methods=["GET"]),
    Route("/v1/batches/{batch_id}/cancel", endpoint(cancel_batch, Guard.API_KEY), methods=["POST"]),
]
