"""``switchyard keys create|list|show|update|rotate|revoke``: the admin API's key operations
(``gateway.access.key_admin``, the same checks) straight on the gateway's Redis. Output is JSON
(``keys list`` prints a table unless ``--format json``); a refused field is named on stderr with
exit status 1. Every change is in the audit log, by
``cli:<OS user>``; a key that changes teams has its limiter counters carried over at once.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

from gateway.access import key_admin
from gateway.access.key_models import KeyListQuery, parse_key_payload
from gateway.access.keys import EDITABLE_FIELDS
from gateway.cli.connect import admin_context
from gateway.cli.output import answer, columns, fail, print_json
from gateway.errors import GatewayError
from gateway.money import format_usd_money, stored_usd_to_nanos
from gateway.policy import Policy, PolicyError, load_policy_file
from gateway.settings import Settings

# The key's scalar limits, each a flag taken as given; the identity fields and the list/dict
# fields (parsed from comma text or KEY=VALUE) are handled one by one.
LIMIT_FLAGS = tuple(
    name for name in EDITABLE_FIELDS if name not in ("name", "team", "models", "tags", "metadata")
)


def percent_list(text: str) -> list[int]:
    """``--alert-thresholds 50,80,100``: whole percents (the payload model checks the range)."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected whole percents separated by commas, got {text!r}"
        ) from None


def add_keys_parser(commands: Any) -> None:
    keys = commands.add_parser("keys", help="manage API keys (directly in Redis)")
    key_commands = keys.add_subparsers(dest="keys_command", required=True)
    _add_key_fields(key_commands.add_parser("create", help="create a key"), update=False)
    list_parser = key_commands.add_parser("list", help="list keys")
    list_parser.add_argument("--team")
    list_parser.add_argument("--status", choices=["active", "revoked", "expired"])
    list_parser.add_argument("--limit", type=int, default=100)
    list_parser.add_argument("--format", dest="output", choices=("table", "json"), default="table")
    key_commands.add_parser("show", help="show one key").add_argument("id")
    update_parser = key_commands.add_parser("update", help="change a key's fields")
    update_parser.add_argument("id")
    _add_key_fields(update_parser, update=True)
    rotate_parser = key_commands.add_parser("rotate", help="issue a new secret")
    rotate_parser.add_argument("id")
    rotate_parser.add_argument("--grace-seconds", dest="grace_seconds", type=float, default=0)
    rotate_parser.add_argument("--idempotency-key", dest="idempotency_key")
    key_commands.add_parser("revoke", help="revoke a key").add_argument("id")


def _add_key_fields(parser: argparse.ArgumentParser, update: bool) -> None:
    parser.add_argument("--name")
    parser.add_argument("--team", help="a team id: its shared limits apply to the key")
    parser.add_argument("--models", help="comma-separated allow-list of models or aliases")
    parser.add_argument("--rpm", type=int, help="requests per minute")
    parser.add_argument("--tpm", type=int, help="tokens per minute")
    parser.add_argument("--budget-usd", dest="budget_usd", type=float)
    parser.add_argument("--budget-period", dest="budget_period", help="day | week | month | total")
    parser.add_argument(
        "--max-parallel-requests",
        dest="max_parallel_requests",
        type=int,
        help="requests in flight at once",
    )
    add_alert_flags(parser)
    parser.add_argument(
        "--expires-at", dest="expires_at", help="ISO 8601 date-time or unix timestamp"
    )
    parser.add_argument("--metadata", action="append", metavar="KEY=VALUE")
    parser.add_argument(
        "--tags", help="comma-separated tags for the key's requests that name none of their own"
    )
    if update:
        parser.add_argument(
            "--clear",
            action="append",
            choices=["name", "team", "models", "tags", *LIMIT_FLAGS],
            help="remove a field (e.g. --clear rpm)",
        )


def add_alert_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budget-mode", dest="budget_mode", choices=["hard", "soft"],
        help="hard (default) refuses past the budget; soft only alerts",
    )  # fmt: skip
    parser.add_argument(
        "--alert-thresholds", dest="alert_thresholds", type=percent_list, metavar="50,80,100",
        help="percents of the budget that send a webhook when crossed",
    )  # fmt: skip


def _fields_from_args(args: argparse.Namespace) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name in ("name", "team", *LIMIT_FLAGS):
        value = getattr(args, name, None)
        if value is not None:
            fields[name] = value
    if args.models is not None:
        fields["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.tags is not None:
        fields["tags"] = [tag.strip() for tag in args.tags.split(",") if tag.strip()]
    if args.metadata:
        metadata: dict[str, str] = {}
        for item in args.metadata:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise GatewayError(f"metadata: expected KEY=VALUE, got {item!r}", param="metadata")
            metadata[key] = value
        fields["metadata"] = metadata
    for name in getattr(args, "clear", None) or []:
        fields[name] = None
    return fields


KEY_COLUMNS = ("id", "name", "team", "status", "models", "rpm", "tpm", "budget", "created")
_NAMED_KEY_COLUMNS = 5  # id .. models, left-aligned; the limits right-aligned


def render_keys(views: list[dict[str, Any]]) -> str:
    """``keys list`` as the usage report's kind of table: one key a line, ``-`` for unset."""
    rows = [
        [
            view["id"],
            view["name"] or "-",
            view["team"] or "-",
            view["status"],
            ",".join(view["models"]) if view["models"] is not None else "(all)",
            _or_dash(view["rpm"]),
            _or_dash(view["tpm"]),
            _budget(view),
            _day(view["created_at"]),
        ]
        for view in views
    ]
    if not rows:
        return "no keys"
    lines = columns(KEY_COLUMNS, rows, left=_NAMED_KEY_COLUMNS)
    return "\n".join([*lines, f"{len(rows)} keys"])


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def _budget(view: dict[str, Any]) -> str:
    if view["budget_usd"] is None:
        return "-"
    amount = format_usd_money(stored_usd_to_nanos(view["budget_usd"]))
    period = view["budget_period"] or "month"  # the limiter's default (metering.gate)
    return amount if period == "total" else f"{amount}/{period}"


def _day(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d")


def _policy_or_none(settings: Settings) -> Policy | None:
    try:
        return load_policy_file(settings.policy_source)
    except PolicyError:
        return None


async def keys_command(settings: Settings, args: argparse.Namespace) -> int:
    async with admin_context(settings) as admin:
        store, command = admin.keys, args.keys_command
        if command == "create":
            policy = _policy_or_none(settings)
            created = await key_admin.create_key(
                store, admin.teams, _fields_from_args(args), policy
            )
            view = created.record.public_view()
            await admin.record("key.create", f"key:{view['id']}", after=view)
            await admin.moves.sweep_key(created.record.id)
            print_json({**view, "key": created.key})
            print("Store the key now: it is not shown again.", file=sys.stderr)
            return 0
        if command == "list":
            filters = {"limit": args.limit, "team": args.team, "status": args.status}
            page = await key_admin.list_keys(store, parse_key_payload(KeyListQuery, filters))
            views = [record.public_view() for record in page.records]
            if args.output == "json":
                return answer(views)
            print(render_keys(views))
            return 0
        if command == "show":
            return answer((await key_admin.show_key(store, args.id)).public_view())
        before = await key_admin.show_key(store, args.id)
        if command == "update":
            changes = _fields_from_args(args)
            if not changes:
                return fail("nothing to update: pass at least one field flag or --clear")
            policy = _policy_or_none(settings)
            updated = await key_admin.update_key(store, admin.teams, args.id, changes, policy)
            await admin.record(
                "key.update", f"key:{args.id}", before.public_view(), updated.public_view()
            )
            await admin.moves.sweep_key(args.id)
            return answer(updated.public_view())
        if command == "rotate":
            grace = {"grace_seconds": args.grace_seconds}
            rotation = await key_admin.rotate_key_once(store, args.id, grace, args.idempotency_key)
            view = rotation.created.record.public_view()
            if not rotation.replayed:
                await admin.record("key.rotate", f"key:{args.id}", before.public_view(), view)
            return answer({**view, "key": rotation.created.key})
        if command == "revoke":
            revoked = (await key_admin.revoke_key(store, args.id)).public_view()
            await admin.record("key.revoke", f"key:{args.id}", before.public_view(), revoked)
            return answer(revoked)
    return fail(f"unknown keys command {args.keys_command!r}")
