"""The team operations, written once for the admin API, the dashboard and the CLI: create,
list, show, update and delete.

Each checks all of its input before it changes anything and raises ``GatewayError`` for the
caller to render. Creating a team adopts the keys that already name it in their ``team``
field (moving their limits state to the team's home); a team with keys in it cannot be
deleted (409 ``team_not_empty``): move or relabel its keys first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from gateway.access.key_models import parse_key_payload
from gateway.access.keys import KeyRecord, KeyStore
from gateway.access.records import found, page_after
from gateway.access.team_models import TeamCreate, TeamListQuery, TeamUpdate
from gateway.access.teams import TeamRecord, TeamStore, is_team_id, team_home
from gateway.errors import Conflict, NotFound, echo

_PAGE = 1000


def checked_team_id(team_id: str) -> str:
    """A team id of the right shape; anything else cannot name a team (404)."""
    if not is_team_id(team_id):
        raise NotFound(f"no team with id {echo(team_id)}", param="id")
    return team_id


async def all_keys(keys: KeyStore) -> AsyncIterator[KeyRecord]:
    """Every key, in creation order (a scan: for rare admin operations only)."""
    after = None
    while True:
        page = await keys.list(limit=_PAGE, after=after)
        for record in page.records:
            yield record
        if not page.has_more or not page.records:
            return
        after = page.records[-1].id


async def team_members(keys: KeyStore, team_id: str) -> list[KeyRecord]:
    """The keys whose limits live in the team's home."""
    home = team_home(team_id)
    return [record async for record in all_keys(keys) if record.limits_home == home]


async def create_team(
    teams: TeamStore, keys: KeyStore, data: dict[str, Any]
) -> tuple[TeamRecord, list[str]]:
    """The new team, and the ids of the keys it adopted (their ``team`` named it already)."""
    payload = parse_key_payload(TeamCreate, data)
    created = await teams.create(payload.id, payload.stored())
    if created is None:
        raise Conflict(f"a team with id {payload.id!r} exists already", code="team_exists")
    adopted = []
    async for record in all_keys(keys):
        if record.team == payload.id and record.limits_home != team_home(payload.id):
            await keys.update(record.id, {}, home=team_home(payload.id))
            adopted.append(record.id)
    return created, adopted


async def list_teams(teams: TeamStore, query: TeamListQuery) -> tuple[list[TeamRecord], bool]:
    return await page_after(teams.list(limit=query.limit, after=query.after or None), "team")


async def show_team(teams: TeamStore, team_id: str) -> TeamRecord:
    return found(await teams.get(checked_team_id(team_id)), "team", team_id)


async def update_team(teams: TeamStore, team_id: str, data: dict[str, Any]) -> TeamRecord:
    """Only the fields in ``data`` change; null clears a limit (``budgets_usd``: all budgets;
    an object replaces them all). Effective on the next request of every key of the team."""
    checked_team_id(team_id)
    payload = parse_key_payload(TeamUpdate, data)
    return found(await teams.update(team_id, payload.stored(set(data))), "team", team_id)


async def delete_team(teams: TeamStore, keys: KeyStore, team_id: str) -> TeamRecord:
    record = found(await teams.get(checked_team_id(team_id)), "team", team_id)
    members = await team_members(keys, team_id)
    if members:
        raise Conflict(
            f"team {team_id!r} still has {len(members)} key(s) (first: {members[0].id}):"
            " move them to another team or none first",
            code="team_not_empty",
        )
    await teams.delete(team_id)
    return record
