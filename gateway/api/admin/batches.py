"""Every key's batches for admins: ``GET /admin/batches`` (``viewer``; ``key``, ``status``,
``limit``, ``after``), ``GET /admin/batches/{id}`` and ``POST /admin/batches/{id}/cancel``
(``operator``, in the audit log). A batch is shown as OpenAI's ``batch`` object, whichever API
made it, with its ``api`` and ``key_id`` beside; its usage is ``GET /admin/usage?group_by=batch``.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response

from gateway.access.admins import Actor
from gateway.api.admin.audit import record_action
from gateway.api.endpoint import admin_routes
from gateway.api.http import json_response
from gateway.api.payloads import parse_query
from gateway.api.v1.batch_views import Batch, batch_view
from gateway.api.v1.batches import cancel_recorded
from gateway.batches.records import Api, BatchRecord
from gateway.errors import NotFound, echo
from gateway.services import Services


class AdminBatchQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: Annotated[str, Field(max_length=200, description="a key id")] | None = None
    api: Literal["openai", "anthropic"] | None = None
    limit: Annotated[int, Field(ge=1, le=1000)] = 100
    after: (
        Annotated[str, Field(max_length=200, description="a batch id: the page after it")] | None
    ) = None


class AdminBatch(Batch):
    """A batch as OpenAI's ``batch`` object, whichever API made it, with its API and key."""

    api: Api
    key_id: str


class AdminBatchList(TypedDict):
    object: Literal["list"]
    data: list[AdminBatch]
    has_more: bool


async def admin_view(services: Services, record: BatchRecord) -> AdminBatch:
    view = batch_view(record, await services.batches.store.counts(record.batch_id))
    return {**view, "api": record.api, "key_id": record.key_id}  # type: ignore[typeddict-item]


async def _batch(services: Services, batch_id: str) -> BatchRecord:
    record = await services.batches.store.batch(batch_id)
    if record is None:
        raise NotFound(f"No batch found with id {echo(batch_id)}.", param="batch_id")
    return record


async def list_batches(request: Request, services: Services, actor: Actor) -> Response:
    """``GET /admin/batches``: newest first, every key's (or one key's)."""
    query = parse_query(AdminBatchQuery, request)
    after = await _batch(services, query.after) if query.after else None
    page = await services.batches.store.batches(
        query.key or None, api=query.api, after=after, limit=query.limit
    )
    data = [await admin_view(services, record) for record in page.items]
    return json_response(AdminBatchList(object="list", data=data, has_more=page.has_more))


async def show_batch(request: Request, services: Services, actor: Actor) -> Response:
    """``GET /admin/batches/{batch_id}``"""
    record = await _batch(services, request.path_params["batch_id"])
    return json_response(await admin_view(services, record))


async def cancel_batch(request: Request, services: Services, actor: Actor) -> Response:
    """``POST /admin/batches/{batch_id}/cancel``"""
    record = await _batch(services, request.path_params["batch_id"])
    current = await cancel_recorded(services, record)
    view = await admin_view(services, current)
    await record_action(
        services, request, actor, "batch.cancel", f"batch:{record.batch_id}",
        before={"status": record.status}, after={"status": current.status},
    )  # fmt: skip
    return json_response(view)


routes = [
    *admin_routes("/admin/batches", "viewer", GET=list_batches),
    *admin_routes("/admin/batches/{batch_id}", "viewer", GET=show_batch),
    *admin_routes("/admin/batches/{batch_id}/cancel", "operator", POST=cancel_batch),
]
