"""``switchyard policy check|get|diff|apply|prices``: the routing policy from the terminal.

``check FILE`` validates a file locally (no gateway needed). ``prices [FILE]`` shows the price
each model is costed at and where it comes from (its ``price:``, the price catalogue and its
version, or none), for FILE or, without one, for the policy in force (``cli/policy_prices.py``). ``get``, ``diff FILE`` and ``apply
FILE`` talk to the running gateway's admin API (``cli/admin_api.py``), as a dashboard or script
would: ``get`` prints the YAML in force, ``diff`` the unified diff from it to FILE (after the
gateway has validated FILE), ``apply`` PUTs FILE, which the gateway validates, writes
atomically, applies and records in the audit log. A refusal names the bad field; exit 1.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Any

from gateway.cli.admin_api import AdminApi
from gateway.cli.output import fail
from gateway.cli.policy_prices import print_prices
from gateway.errors import GatewayError
from gateway.policy import PolicyError, load_policy_file
from gateway.settings import Settings

YAML = {"content-type": "application/yaml"}


def add_policy_parser(commands: Any) -> None:
    policy = commands.add_parser(
        "policy", help="routing policy: check a file, or edit the live one"
    )
    policy_commands = policy.add_subparsers(dest="policy_command", required=True)
    policy_commands.add_parser("check", help="validate a policy file (locally)").add_argument(
        "file"
    )
    get = policy_commands.add_parser("get", help="print the policy in force (YAML)")
    diff = policy_commands.add_parser("diff", help="what applying FILE would change")
    diff.add_argument("file")
    apply = policy_commands.add_parser("apply", help="validate FILE and put it in force")
    apply.add_argument("file")
    prices = policy_commands.add_parser(
        "prices", help="each model's price and its source (FILE, or the policy in force)"
    )
    prices.add_argument("file", nargs="?")
    prices.add_argument("--json", action="store_true", help="print JSON rows")
    for parser in (get, diff, apply, prices):
        AdminApi.add_arguments(parser)


def policy_needs_settings(args: argparse.Namespace) -> bool:
    return args.policy_command != "check" and not (args.policy_command == "prices" and args.file)


def policy_command(args: argparse.Namespace, settings: Settings | None = None) -> int:
    if args.policy_command == "check":
        return policy_check(args.file)
    if args.policy_command == "prices" and args.file:
        return print_prices(_read(args.file), args.file, as_json=args.json)
    assert settings is not None
    api = AdminApi.from_args(settings, args)
    if args.policy_command == "prices":
        return print_prices(_live_text(api), "policy in force", as_json=args.json)
    if args.policy_command == "get":
        sys.stdout.write(_live_text(api))
        return 0
    text = _read(args.file)
    if args.policy_command == "diff":
        api.call("POST", "/admin/policy/validate", content=text.encode(), headers=YAML)
        return _print_diff(_live_text(api), text, args.file)
    applied = api.call("PUT", "/admin/policy", content=text.encode(), headers=YAML).json()
    print(f"applied: {args.file}: version {applied['version']}")
    return 0


def _live_text(api: AdminApi) -> str:
    return api.call("GET", "/admin/policy", params={"format": "yaml"}).text


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise GatewayError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise GatewayError(f"cannot read {path}: not UTF-8 text") from None


def _print_diff(live: str, proposed: str, path: str) -> int:
    lines = list(
        difflib.unified_diff(
            live.splitlines(keepends=True),
            proposed.splitlines(keepends=True),
            fromfile="policy in force",
            tofile=path,
        )
    )
    if not lines:
        print(f"no changes: {path} is the policy in force")
        return 0
    sys.stdout.writelines(line if line.endswith("\n") else line + "\n" for line in lines)
    return 0


def policy_check(path: str) -> int:
    try:
        policy = load_policy_file(path)
    except PolicyError as exc:
        where = exc.path or "(file)"
        return fail(f"{path}: {where}: {exc.message}")
    print(
        f"ok: {path}: {len(policy.providers)} providers, {len(policy.models)} models, "
        f"{len(policy.aliases)} aliases"
    )
    return 0
