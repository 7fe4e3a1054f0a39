"""``switchyard batches list|show|cancel``: every key's batches, through the running gateway's
admin API (``cli/admin_api.py``; ``/admin/batches``). ``list`` prints a table (``--format json``
for JSON; ``--key`` for one key's); ``show ID`` and ``cancel ID`` print the batch as JSON."""

from __future__ import annotations

import argparse
from typing import Any

from gateway.cli.admin_api import AdminApi
from gateway.cli.output import answer, columns
from gateway.settings import Settings

TABLE = ("id", "api", "key_id", "status", "total", "completed", "failed", "created_at")


def add_batches_parser(commands: Any) -> None:
    batches = commands.add_parser("batches", help="batches of every key: list, show, cancel")
    batch_commands = batches.add_subparsers(dest="batches_command", required=True)
    listing = batch_commands.add_parser("list", help="batches, newest first")
    listing.add_argument("--key", help="only this key's (a key id)")
    listing.add_argument("--limit", type=int, default=100)
    listing.add_argument("--format", choices=("table", "json"), default="table")
    show = batch_commands.add_parser("show", help="one batch, with its request counts")
    show.add_argument("batch_id")
    cancel = batch_commands.add_parser("cancel", help="cancel a batch (its answers are kept)")
    cancel.add_argument("batch_id")
    for parser in (listing, show, cancel):
        AdminApi.add_arguments(parser)


def batches_command(settings: Settings, args: argparse.Namespace) -> int:
    api = AdminApi.from_args(settings, args)
    if args.batches_command == "show":
        return answer(api.call("GET", f"/admin/batches/{args.batch_id}").json())
    if args.batches_command == "cancel":
        return answer(api.call("POST", f"/admin/batches/{args.batch_id}/cancel").json())
    params: dict[str, Any] = {"limit": args.limit}
    if args.key:
        params["key"] = args.key
    listing = api.call("GET", "/admin/batches", params=params).json()
    if args.format == "json":
        return answer(listing)
    rows = [
        [
            batch["id"],
            batch["api"],
            batch["key_id"],
            batch["status"],
            *(str(batch["request_counts"][name]) for name in ("total", "completed", "failed")),
            str(batch["created_at"]),
        ]
        for batch in listing["data"]
    ]
    for line in columns(TABLE, rows, left=4):
        print(line)
    return 0
