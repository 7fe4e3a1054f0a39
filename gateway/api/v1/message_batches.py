"""Anthropic's Message Batches on the Anthropic door, over the same machinery as OpenAI's batches:
``POST /v1/messages/batches``, ``GET /v1/messages/batches`` (``after_id``, ``before_id``,
``limit``), ``GET /v1/messages/batches/{id}``, ``POST /v1/messages/batches/{id}/cancel``,
``GET /v1/messages/batches/{id}/results`` (JSONL) and ``DELETE /v1/messages/batches/{id}``.

The requests come inline (``{"requests": [{"custom_id", "params"}]}``, within
``SWITCHYARD_BATCH_MAX_FILE_BYTES``); each ``params`` is checked as a ``/v1/messages`` body at
once, so a bad one refuses the batch with a 400 naming it (``requests.3.params.max_tokens``).
Every error is in Anthropic's envelope, authentication included, and the key is read from
``x-api-key`` or a bearer, as on ``/v1/messages``. Keys see only their own batches.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.access.auth import Principal, client_credential
from gateway.api.endpoint import Guard, endpoint
from gateway.api.envelopes import error_response
from gateway.api.http import json_response, read_json_object
from gateway.api.id_page import IdPage, id_page
from gateway.api.payloads import parse_query
from gateway.api.v1.batch_views import MessageBatch, message_batch_view
from gateway.api.v1.batches import cancel_recorded
from gateway.api.v1.doors import MESSAGES
from gateway.batches.jsonl import InputRefused, anthropic_lines
from gateway.batches.records import COMPLETION_WINDOW, WINDOW_MS, BatchRecord, NewLine, new_batch_id
from gateway.errors import (
    Conflict,
    GatewayError,
    InvalidRequest,
    NotFound,
    ServiceUnavailable,
    echo,
)
from gateway.services import Services
from gateway.store.connect import REDIS_FAILURES

Handler = Callable[[Request, Services, Principal], Awaitable[Response]]


class MessageBatchListQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limit: Annotated[int, Field(ge=1, le=1000)] = 20
    after_id: Annotated[str, Field(max_length=200)] | None = None
    before_id: Annotated[str, Field(max_length=200)] | None = None


class MessageBatchList(IdPage):
    data: list[MessageBatch]


class MessageBatchDeleted(TypedDict):
    id: str
    type: Literal["message_batch_deleted"]


def _anthropic(handler: Handler) -> Callable[[Request, Services], Awaitable[Response]]:
    """``handler`` with the caller's key, every refusal in Anthropic's envelope."""

    async def call(request: Request, services: Services) -> Response:
        try:
            principal = await services.auth.authenticate(client_credential(request.headers))
            return await handler(request, services, principal)
        except GatewayError as exc:
            return error_response("anthropic_messages", exc)
        except REDIS_FAILURES as exc:
            unavailable = ServiceUnavailable(f"the key store is unavailable ({type(exc).__name__})")
            return error_response("anthropic_messages", unavailable)

    call.__name__ = handler.__name__
    call.__doc__ = handler.__doc__
    return call


async def owned_message_batch(
    services: Services, principal: Principal, batch_id: str
) -> BatchRecord:
    record = await services.batches.store.batch(batch_id)
    if record is None or record.key_id != principal.key_id or record.api != "anthropic":
        raise NotFound(f"No message batch found with id {echo(batch_id)}.", code=None)
    return record


def results_url(request: Request, batch_id: str) -> str:
    return f"{str(request.base_url).rstrip('/')}/v1/messages/batches/{batch_id}/results"


async def view(request: Request, services: Services, record: BatchRecord) -> MessageBatch:
    counts = await services.batches.store.counts(record.batch_id)
    return message_batch_view(record, counts, results_url(request, record.batch_id))


def _checked(lines: list[NewLine], requests: list[Any]) -> None:
    """Each request's ``params`` as a /v1/messages body (a 400 naming the first bad one)."""
    for line, item in zip(lines, requests, strict=True):
        params = dict(item["params"])
        where = f"requests.{line.index}.params"
        if params.get("stream") is True:
            raise InvalidRequest(f"{where}.stream: a batch's requests cannot stream")
        try:
            MESSAGES.check(params)
        except InvalidRequest as exc:
            param = f"{where}.{exc.param}" if exc.param else where
            raise InvalidRequest(f"{where}: {exc.message}", param=param) from None


async def create(request: Request, services: Services, principal: Principal) -> Response:
    """``POST /v1/messages/batches``"""
    batches = services.batches
    data = await read_json_object(request, batches.settings.max_file_bytes)
    extra = sorted(set(data) - {"requests"})
    if extra:
        raise InvalidRequest(
            f"{extra[0][:64]}: Extra inputs are not permitted", param=extra[0][:64]
        )
    requests = data.get("requests")
    try:
        lines = anthropic_lines(requests, batches.settings.max_lines)
    except InputRefused as refused:
        raise InvalidRequest(refused.problems[0].message, param="requests") from None
    assert isinstance(requests, list)
    _checked(lines, requests)
    now = int(time.time() * 1000)
    record = BatchRecord(
        batch_id=new_batch_id("anthropic"),
        key_id=principal.key_id,
        api="anthropic",
        endpoint="/v1/messages",
        input_file_id=None,
        completion_window=COMPLETION_WINDOW,
        metadata_json=None,
        status="in_progress",
        created_ms=now,
        expires_ms=now + WINDOW_MS,
        in_progress_ms=now,
        total=len(lines),
    )
    await batches.store.add_batch_with_lines(record, lines)
    return json_response(await view(request, services, record))


async def list_all(request: Request, services: Services, principal: Principal) -> Response:
    """``GET /v1/messages/batches``: the key's batches, newest first."""
    query = parse_query(MessageBatchListQuery, request)
    store = services.batches.store
    after = before = None
    if query.after_id:
        after = await owned_message_batch(services, principal, query.after_id)
    if query.before_id:
        before = await owned_message_batch(services, principal, query.before_id)
    page = await store.batches(
        principal.key_id, api="anthropic", after=after, limit=query.limit, newer_than=before
    )
    data = [await view(request, services, record) for record in page.items]
    answer = MessageBatchList(data=data, **id_page(data, page.has_more))
    return json_response(answer)


async def retrieve(request: Request, services: Services, principal: Principal) -> Response:
    """``GET /v1/messages/batches/{batch_id}``"""
    record = await owned_message_batch(services, principal, request.path_params["batch_id"])
    return json_response(await view(request, services, record))


async def cancel(request: Request, services: Services, principal: Principal) -> Response:
    """``POST /v1/messages/batches/{batch_id}/cancel``"""
    record = await owned_message_batch(services, principal, request.path_params["batch_id"])
    if record.final:  # Anthropic answers an ended batch as it is
        return json_response(await view(request, services, record))
    return json_response(await view(request, services, await cancel_recorded(services, record)))


async def results(request: Request, services: Services, principal: Principal) -> Response:
    """``GET /v1/messages/batches/{batch_id}/results``: JSONL, one line per request."""
    record = await owned_message_batch(services, principal, request.path_params["batch_id"])
    if not record.final or record.output_file_id is None:
        raise NotFound(f"Message batch {record.batch_id} has not ended yet: no results.", code=None)
    data = await services.batches.store.file_bytes(record.output_file_id)
    return Response(data, media_type="application/x-jsonl")


async def delete(request: Request, services: Services, principal: Principal) -> Response:
    """``DELETE /v1/messages/batches/{batch_id}``: an ended batch, its lines and results."""
    record = await owned_message_batch(services, principal, request.path_params["batch_id"])
    if not record.final:
        raise Conflict(
            f"Message batch {record.batch_id} is still being processed: cancel it first.",
            code=None,
        )
    store = services.batches.store
    await store.delete_batch(record.batch_id)
    if record.output_file_id is not None:
        await store.delete_file(record.output_file_id)
    return json_response(MessageBatchDeleted(id=record.batch_id, type="message_batch_deleted"))


def _route(path: str, handler: Handler, method: str) -> Route:
    return Route(path, endpoint(_anthropic(handler), Guard.NONE), methods=[method])


_ONE = "/v1/messages/batches/{batch_id}"
routes = [
    _route("/v1/messages/batches", create, "POST"),
    _route("/v1/messages/batches", list_all, "GET"),
    _route(_ONE, retrieve, "GET"),
    _route(_ONE, delete, "DELETE"),
    _route(_ONE + "/cancel", cancel, "POST"),
    _route(_ONE + "/results", results, "GET"),
]
