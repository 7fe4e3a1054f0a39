"""``switchyard teams create|list|show|update|delete`` and ``switchyard tokens
create|list|revoke``: the admin API's team and admin-token operations
(``gateway.access.team_admin``, ``gateway.access.token_admin``, the same checks) straight on
the gateway's Redis. Output is JSON; every change is in the audit log, by ``cli:<OS user>``.
A token is printed once, when created.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gateway.access import team_admin, token_admin
from gateway.access.admins import ROLES
from gateway.access.team_models import TeamListQuery
from gateway.access.token_admin import TokenListQuery
from gateway.cli.connect import admin_context
from gateway.cli.keys import add_alert_flags
from gateway.cli.output import answer, fail, print_json
from gateway.settings import Settings

TEAM_LIMITS = ("name", "rpm", "tpm", "max_parallel_requests", "budget_mode", "alert_thresholds")
PERIODS = ("day", "week", "month", "total")


def add_teams_parser(commands: Any) -> None:
    teams = commands.add_parser("teams", help="manage teams and their shared limits")
    team_commands = teams.add_subparsers(dest="teams_command", required=True)
    create = team_commands.add_parser("create", help="create a team")
    create.add_argument("id")
    _add_team_fields(create, update=False)
    team_commands.add_parser("list", help="list teams")
    team_commands.add_parser("show", help="a team and its usage now").add_argument("id")
    update = team_commands.add_parser("update", help="change a team's limits")
    update.add_argument("id")
    _add_team_fields(update, update=True)
    team_commands.add_parser("delete", help="delete a team with no keys").add_argument("id")


def add_tokens_parser(commands: Any) -> None:
    tokens = commands.add_parser("tokens", help="manage named admin tokens")
    token_commands = tokens.add_subparsers(dest="tokens_command", required=True)
    create = token_commands.add_parser("create", help="create an admin token (shown once)")
    create.add_argument("--name", required=True)
    create.add_argument("--role", required=True, choices=ROLES)
    token_commands.add_parser("list", help="list admin tokens")
    token_commands.add_parser("revoke", help="revoke an admin token").add_argument("id")


def _add_team_fields(parser: argparse.ArgumentParser, update: bool) -> None:
    parser.add_argument("--name")
    parser.add_argument("--rpm", type=int, help="requests per minute, all the team's keys")
    parser.add_argument("--tpm", type=int, help="tokens per minute, all the team's keys")
    parser.add_argument(
        "--max-parallel-requests", dest="max_parallel_requests", type=int,
        help="requests in flight at once, all the team's keys",
    )  # fmt: skip
    for period in PERIODS:
        parser.add_argument(f"--budget-{period}", dest=f"budget_{period}", type=float,
                            metavar="USD", help=f"spend per {period}")  # fmt: skip
    add_alert_flags(parser)
    if update:
        parser.add_argument(
            "--clear", action="append", choices=[*TEAM_LIMITS, "budgets"],
            help="remove a limit (--clear budgets removes every budget)",
        )  # fmt: skip


def _team_fields(args: argparse.Namespace) -> dict[str, Any]:
    fields: dict[str, Any] = {
        name: getattr(args, name) for name in TEAM_LIMITS if getattr(args, name) is not None
    }
    budgets = {p: getattr(args, f"budget_{p}") for p in PERIODS}
    budgets = {p: usd for p, usd in budgets.items() if usd is not None}
    if budgets:
        fields["budgets_usd"] = budgets
    for name in getattr(args, "clear", None) or []:
        fields["budgets_usd" if name == "budgets" else name] = None
    return fields


async def teams_command(settings: Settings, args: argparse.Namespace) -> int:
    async with admin_context(settings) as admin:
        command = args.teams_command
        if command == "create":
            team, adopted = await team_admin.create_team(
                admin.teams, admin.keys, {"id": args.id, **_team_fields(args)}
            )
            view = {**team.public_view(), "adopted_keys": adopted}
            await admin.record("team.create", f"team:{team.id}", after=view)
            for key_id in adopted:
                await admin.moves.sweep_key(key_id)
            return answer(view)
        if command == "list":
            teams, _ = await team_admin.list_teams(admin.teams, TeamListQuery(limit=1000))
            return answer([team.public_view() for team in teams])
        if command == "show":
            team = await team_admin.show_team(admin.teams, args.id)
            usage = await admin.limiter.team_status(
                team.id, rpm=team.rpm, tpm=team.tpm, budgets_nanos=team.budgets_nanos,
                max_parallel=team.max_parallel_requests,
            )  # fmt: skip
            return answer({**team.public_view(), "usage": usage})
        if command == "update":
            changes = _team_fields(args)
            if not changes:
                return fail("nothing to update: pass at least one limit flag or --clear")
            before = await team_admin.show_team(admin.teams, args.id)
            team = await team_admin.update_team(admin.teams, args.id, changes)
            await admin.record(
                "team.update", f"team:{args.id}", before.public_view(), team.public_view()
            )
            return answer(team.public_view())
        if command == "delete":
            team = await team_admin.delete_team(admin.teams, admin.keys, args.id)
            await admin.limiter.forget_team(args.id)
            await admin.record("team.delete", f"team:{args.id}", before=team.public_view())
            return answer({"id": args.id, "object": "team", "deleted": True})
    return fail(f"unknown teams command {args.teams_command!r}")


async def tokens_command(settings: Settings, args: argparse.Namespace) -> int:
    async with admin_context(settings) as admin:
        command = args.tokens_command
        if command == "create":
            data = {"name": args.name, "role": args.role}
            record, token = await token_admin.create_token(admin.tokens, data, admin.actor)
            await admin.record("token.create", f"token:{record.id}", after=record.public_view())
            print_json({**record.public_view(), "token": token})
            print("Store the token now: it is not shown again.", file=sys.stderr)
            return 0
        if command == "list":
            tokens, _ = await token_admin.list_tokens(admin.tokens, TokenListQuery(limit=1000))
            return answer([token.public_view() for token in tokens])
        if command == "revoke":
            before = await token_admin.show_token(admin.tokens, args.id)
            record = await token_admin.revoke_token(admin.tokens, args.id)
            await admin.record(
                "token.revoke", f"token:{args.id}", before.public_view(), record.public_view()
            )
            return answer(record.public_view())
    return fail(f"unknown tokens command {args.tokens_command!r}")
