"""``switchyard usage report``: the admin usage report in the terminal, as CSV or as JSON.

It reads the usage store (``SWITCHYARD_USAGE_STORE_URL``: the embedded SQLite file under
DATA_DIR, or PostgreSQL) with the same ``UsageReports`` as ``GET /admin/usage``, so the numbers
are the same; dates are UTC days, inclusive. Costs print as exact USD decimals computed from the
integer nano-dollars (``0.001692000``). How fresh it is comes from the gateway's Redis: events
still in its buffer are counted (a note on stderr for the table and CSV, ``pending_export`` in
JSON); when Redis cannot be reached the report is still printed, with a note saying so.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway.access.keys import KeyStore
from gateway.cli.connect import key_store
from gateway.cli.output import columns
from gateway.ledger import StoreConfigError, open_store
from gateway.metering.buffer import UsageBuffer
from gateway.metering.reports import (
    GROUP_BYS,
    ReportError,
    UsageReports,
    render_csv,
    report_range,
)
from gateway.money import format_usd_exact
from gateway.settings import Settings, SettingsError
from gateway.store.connect import REDIS_FAILURES

DEFAULT_RANGE_DAYS = 30
OUTPUTS = ("table", "csv", "json")
TABLE_COLUMNS = (
    ("requests", "requests"),
    ("prompt_tokens", "prompt"),
    ("completion_tokens", "completion"),
    ("cached_tokens", "cached"),
    ("cost_nanos", "cost_usd"),
    ("errors", "errors"),
    ("estimated", "estimated"),
)


def add_usage_parser(commands: Any) -> None:
    """Register ``usage report`` on the CLI's subcommand parsers."""
    usage = commands.add_parser("usage", help="usage and cost reports (from the usage store)")
    usage_commands = usage.add_subparsers(dest="usage_command", required=True)
    report = usage_commands.add_parser("report", help="usage totals over a date range")
    report.add_argument("--from", dest="date_from", metavar="YYYY-MM-DD")
    report.add_argument("--to", dest="date_to", metavar="YYYY-MM-DD", help="default: today")
    report.add_argument("--group-by", dest="group_by", choices=GROUP_BYS, default="key")
    report.add_argument("--format", dest="output", choices=OUTPUTS, default="table")


async def usage_command(settings: Settings, args: argparse.Namespace) -> int:
    try:
        store = await open_store(
            settings.usage_store.url,
            data_dir=settings.data_dir,
            retention_days=settings.usage_store.retention_days,
        )
    except StoreConfigError as exc:
        raise SettingsError(f"SWITCHYARD_USAGE_STORE_URL: {exc}") from None
    try:
        async with _keys_of(settings) as keys:
            buffer = None
            if keys is not None:
                buffer = UsageBuffer(keys.redis)
                buffer.bind(store.store_id)
            labels = keys.labels if keys is not None else None
            return await run_usage_command(UsageReports(store, buffer, key_labels=labels), args)
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def _keys_of(settings: Settings) -> AsyncIterator[KeyStore | None]:
    """The key store on Redis (the same Redis rules as ``keys``): the store's buffer and the
    keys' names are read there. None when Redis cannot be reached: the report is then printed
    without knowing what is not exported yet, and with bare key ids."""
    connection = key_store(settings)
    try:
        keys = await connection.__aenter__()
    except REDIS_FAILURES as exc:
        print(f"note: Redis unreachable ({type(exc).__name__}): events not yet exported to the "
              "usage store are not counted", file=sys.stderr)  # fmt: skip
        yield None
        return
    try:
        yield keys
    finally:
        await connection.__aexit__(None, None, None)


async def run_usage_command(reports: UsageReports, args: argparse.Namespace) -> int:
    try:
        start, end = report_range(
            args.date_from, args.date_to, today=reports.today(), default_days=DEFAULT_RANGE_DAYS
        )
        report = await reports.admin_usage(start, end, args.group_by)
    except ReportError as exc:
        print(f"error: --{exc.param.replace('_', '-')}: {exc.message}", file=sys.stderr)
        return 1
    if args.output == "csv":
        sys.stdout.write(render_csv(report["data"], args.group_by))
    elif args.output == "json":
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        print(render_table(report))
    if args.output != "json" and report["pending_export"]:
        print(
            f"note: as of {report['as_of']}, {report['pending_export']} events are not exported "
            "to the usage store yet (a running gateway exports them within seconds)",
            file=sys.stderr,
        )
    return 0


def _cell(name: str, row: dict[str, Any]) -> str:
    if name == "cost_nanos":
        return format_usd_exact(row["cost_nanos"])
    return str(row[name])


def _names(group_by: str, row: dict[str, Any]) -> list[str]:
    """The row's left-aligned cells: the group (``(none)`` for requests without a tag or end
    user), and for keys their name and team."""
    value = str(row[group_by]) or ("(none)" if group_by in ("tag", "user") else "")
    if group_by != "key":
        return [value]
    return [value, row.get("key_name") or "", row.get("key_team") or ""]


def render_table(report: dict[str, Any]) -> str:
    """Aligned columns, names left and numbers right, with a TOTAL line."""
    group_by = report["group_by"]
    titles = [group_by, "name", "team"] if group_by == "key" else [group_by]
    named = len(titles)
    header = [*titles, *(title for _, title in TABLE_COLUMNS)]
    rows = [
        [*_names(group_by, row), *(_cell(n, row) for n, _ in TABLE_COLUMNS)]
        for row in report["data"]
    ]
    total = [
        "TOTAL",
        *([""] * (named - 1)),
        *(_cell(n, report["totals"]) for n, _ in TABLE_COLUMNS),
    ]
    lines = columns(header, [*rows, total], left=named)
    rule = lines[1]
    title = f"usage {report['from']} .. {report['to']} by {group_by}"
    return "\n".join([title, *lines[:-1], rule, lines[-1]])
