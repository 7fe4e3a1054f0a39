"""Admin API for teams (``operator`` role): create, list, show (with what the team has used of
its limits now), update and delete. The operations are ``gateway.access.team_admin``'s, shared
with the dashboard and the CLI; each change is in the audit log.

A team's limits (rpm, tpm, budgets per day, week, month and total, max_parallel_requests) are
shared by all its keys and checked in the same atomic step as each key's own
(docs/limits.md). Creating a team adopts the keys whose ``team`` already names it.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from starlette.requests import Request
from starlette.responses import Response

from gateway.access import team_admin
from gateway.access.admins import Actor
from gateway.access.team_models import TeamListQuery
from gateway.access.teams import TeamRecord, TeamView
from gateway.api.admin.audit import record_action
from gateway.api.endpoint import admin_routes
from gateway.api.http import json_response, read_json_object
from gateway.api.payloads import parse_query
from gateway.services import Services

MAX_TEAM_BODY_BYTES = 16384
# Adopted keys whose counters are carried over at once; the background sweep does the rest.
SWEEP_NOW = 100


class CreatedTeam(TeamView):
    adopted_keys: list[str]


class TeamWithUsage(TeamView):
    usage: dict[str, Any]


class TeamList(TypedDict):
    object: Literal["list"]
    data: list[TeamView]
    has_more: bool


class TeamDeleted(TypedDict):
    id: str
    object: Literal["team"]
    deleted: Literal[True]


def _team_id(request: Request) -> str:
    return team_admin.checked_team_id(request.path_params["team_id"])


async def team_view(services: Services, team: TeamRecord) -> TeamWithUsage:
    """The team, and its usage against its limits right now."""
    usage = await services.limiter.team_status(
        team.id,
        rpm=team.rpm,
        tpm=team.tpm,
        budgets_nanos=team.budgets_nanos,
        max_parallel=team.max_parallel_requests,
    )
    return TeamWithUsage(**team.public_view(), usage=usage)


async def create_team(request: Request, services: Services, actor: Actor) -> Response:
    data = await read_json_object(request, MAX_TEAM_BODY_BYTES)
    team, adopted = await team_admin.create_team(services.teams, services.keys, data)
    view = CreatedTeam(**team.public_view(), adopted_keys=adopted)
    await record_action(
        services, request, actor, "team.create", f"team:{team.id}", after=view
    )  # fmt: skip
    for key_id in adopted[:SWEEP_NOW]:
        services.auth.invalidate(key_id)
        try:
            await services.moves.sweep_key(key_id)
        except Exception as exc:  # the background sweep finishes it
            services.log.warning("limit_move_deferred", key_id=key_id, error=type(exc).__name__)
    return json_response(view, status=201)


async def list_teams(request: Request, services: Services, actor: Actor) -> Response:
    teams, has_more = await team_admin.list_teams(
        services.teams, parse_query(TeamListQuery, request)
    )
    data = [team.public_view() for team in teams]
    return json_response(TeamList(object="list", data=data, has_more=has_more))


async def get_team(request: Request, services: Services, actor: Actor) -> Response:
    team = await team_admin.show_team(services.teams, _team_id(request))
    return json_response(await team_view(services, team))


async def update_team(request: Request, services: Services, actor: Actor) -> Response:
    team_id = _team_id(request)
    data = await read_json_object(request, MAX_TEAM_BODY_BYTES)
    before = await services.teams.get(team_id)
    team = await team_admin.update_team(services.teams, team_id, data)
    await record_action(
        services, request, actor, "team.update", f"team:{team_id}",
        before=before.public_view() if before else None, after=team.public_view(),
    )  # fmt: skip
    return json_response(team.public_view())


async def delete_team(request: Request, services: Services, actor: Actor) -> Response:
    team_id = _team_id(request)
    team = await team_admin.delete_team(services.teams, services.keys, team_id)
    await services.limiter.forget_team(team_id)
    await record_action(
        services, request, actor, "team.delete", f"team:{team_id}", before=team.public_view()
    )
    return json_response(TeamDeleted(id=team_id, object="team", deleted=True))


OPERATOR = "operator"
routes = [
    *admin_routes("/admin/teams", OPERATOR, POST=create_team, GET=list_teams),
    *admin_routes(
        "/admin/teams/{team_id}", OPERATOR, GET=get_team, PATCH=update_team, DELETE=delete_team
    ),
]
