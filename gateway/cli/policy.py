"""``switchyard policy check FILE``: validate a routing policy; exit 0, or 1 naming the bad
field."""

from __future__ import annotations

import argparse
from typing import Any

from gateway.cli.output import fail
from gateway.routing.policy import PolicyError, load_policy_file


def add_policy_parser(commands: Any) -> None:
    policy = commands.add_parser("policy", help="routing policy tools")
    policy_commands = policy.add_subparsers(dest="policy_command", required=True)
    policy_commands.add_parser("check", help="validate a policy file").add_argument("file")


def policy_command(args: argparse.Namespace) -> int:
    return policy_check(args.file)


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
