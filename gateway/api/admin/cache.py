"""The response cache for operators: ``GET /admin/cache`` (stats) and ``DELETE /admin/cache``
(purge), ``Guard.ADMIN``: stats for a ``viewer``, a purge for an ``operator``.

Both take ``model`` and ``team`` filters (a canonical model name, a team name). A purge with
neither must say ``all=true``, so an empty filter never empties the whole cache by accident.
Redis unreachable: a 503 naming the cache.
"""

from __future__ import annotations

from typing import Annotated, TypedDict

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.access.admins import Actor
from gateway.api.admin.audit import record_action
from gateway.api.endpoint import Guard, endpoint
from gateway.api.http import json_response
from gateway.api.payloads import parse_query
from gateway.cache import CacheUnavailable
from gateway.cache.stats import PurgeView
from gateway.errors import InvalidRequest, ServiceUnavailable
from gateway.services import Services


class CacheQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: (
        Annotated[str, Field(min_length=1, max_length=1000, description="a canonical model")] | None
    ) = None
    team: Annotated[str, Field(min_length=1, max_length=200)] | None = None


class PurgeQuery(CacheQuery):
    all: bool = Field(False, description="purge every entry")


class CachePurged(TypedDict):
    purged: PurgeView


def _unavailable(exc: CacheUnavailable) -> ServiceUnavailable:
    return ServiceUnavailable("the response cache (Redis) is unavailable", code="cache_unavailable")


async def cache_stats(request: Request, services: Services, actor: Actor) -> Response:
    """``GET /admin/cache?model=&team=``: live entries, hit ratio and counters, per scope."""
    query = parse_query(CacheQuery, request)
    try:
        stats = await services.cache.stats(model=query.model, team=query.team)
    except CacheUnavailable as exc:
        raise _unavailable(exc) from None
    return json_response(stats.to_dict())


async def cache_purge(request: Request, services: Services, actor: Actor) -> Response:
    """``DELETE /admin/cache?model=&team=`` (or ``?all=true``): delete the matching entries."""
    query = parse_query(PurgeQuery, request)
    if query.model is None and query.team is None and not query.all:
        raise InvalidRequest(
            "give model and/or team, or all=true to purge every entry", param="all"
        )
    try:
        purged = await services.cache.purge(model=query.model, team=query.team)
    except CacheUnavailable as exc:
        raise _unavailable(exc) from None
    await record_action(
        services, request, actor, "cache.purge", "cache",
        before={"model": query.model, "team": query.team}, after=purged.to_dict(),
    )  # fmt: skip
    return json_response(CachePurged(purged=purged.to_dict()))


routes = [
    Route("/admin/cache", endpoint(cache_stats, Guard.ADMIN, "viewer"), methods=["GET"]),
    Route("/admin/cache", endpoint(cache_purge, Guard.ADMIN, "operator"), methods=["DELETE"]),
]
