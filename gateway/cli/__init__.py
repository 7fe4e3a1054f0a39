"""The ``switchyard`` command (also ``python -m gateway``), one module per command:

- ``serve`` (``cli/serve.py``): run the gateway;
- ``init`` (``cli/init.py``): write an editable copy of the shipped default policy;
- ``keys create|list|show|update|rotate|revoke`` (``cli/keys.py``): the admin API's key
  operations, straight on the gateway's Redis (``cli/connect.py``). Output is JSON (``keys
  list``: a table, or JSON with ``--format json``);
- ``teams create|list|show|update|delete``, ``tokens create|list|revoke`` (``cli/teams.py``):
  teams with shared limits, named admin tokens; every change of these is in the audit log;
- ``usage report`` (``cli/usage.py``): the admin usage report as a table, CSV or JSON;
- ``batches list|show|cancel`` (``cli/batches.py``): every key's batches, through the admin API;
- ``policy check FILE`` (``cli/policy.py``): validate a routing policy locally; ``policy
  get|diff FILE|apply FILE``: the live policy, through the gateway's admin API
  (``cli/admin_api.py``).

A bad setting exits 2 naming the variable; any other refusal exits 1 with one line on stderr.
A closed stdout (``| head``) ends the command quietly with status 0, as Unix tools do.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from gateway.cli.batches import add_batches_parser, batches_command
from gateway.cli.init import add_init_parser, init_command
from gateway.cli.keys import add_keys_parser, keys_command
from gateway.cli.output import fail
from gateway.cli.policy import add_policy_parser, policy_command, policy_needs_settings
from gateway.cli.serve import add_serve_parser, serve_command
from gateway.cli.teams import add_teams_parser, add_tokens_parser, teams_command, tokens_command
from gateway.cli.usage import add_usage_parser, usage_command
from gateway.data_dir import PRIVATE_UMASK, DataDirBusy
from gateway.errors import GatewayError
from gateway.settings import SettingsError, load_settings
from gateway.store.connect import REDIS_FAILURES

# --help's text: plain words (the module docstring is reST for the code's readers).
DESCRIPTION = (
    "Switchyard, a self-hosted LLM gateway: serve it, manage keys, teams and admin tokens, "
    "read usage reports and edit the routing policy."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchyard", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(commands)
    add_init_parser(commands)
    add_keys_parser(commands)
    add_teams_parser(commands)
    add_tokens_parser(commands)
    add_policy_parser(commands)
    add_usage_parser(commands)
    add_batches_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        status = _dispatch(build_parser().parse_args(argv))
        sys.stdout.flush()  # inside the guard: a pipe closed early fails here, not at exit
    except BrokenPipeError:
        # Redis and HTTP clients wrap their socket errors: a bare EPIPE is stdout's reader gone.
        _silence_stdout()
        return 0
    return status


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "policy" and not policy_needs_settings(args):
        return policy_command(args)
    if args.command in ("init", "policy", "batches"):  # they write no DATA_DIR files
        return _run(args)
    # The other commands write under DATA_DIR: privately (data_dir.py). Restored after, for
    # callers in a longer-lived process (the tests).
    previous = os.umask(PRIVATE_UMASK)
    try:
        return _run(args)
    finally:
        os.umask(previous)


def _run(args: argparse.Namespace) -> int:
    try:
        settings = load_settings()
    except SettingsError as exc:
        return fail(str(exc), 2)
    try:
        if args.command == "serve":
            return serve_command(settings, args)
        if args.command == "policy":
            return policy_command(args, settings)
        if args.command == "init":
            return init_command(settings, args)
        if args.command == "batches":
            return batches_command(settings, args)
        if args.command == "usage":
            return asyncio.run(usage_command(settings, args))
        if args.command == "teams":
            return asyncio.run(teams_command(settings, args))
        if args.command == "tokens":
            return asyncio.run(tokens_command(settings, args))
        return asyncio.run(keys_command(settings, args))
    except BrokenPipeError:
        raise  # stdout closed by the reader (``| head``), not Redis: main ends quietly
    except SettingsError as exc:
        return fail(str(exc), 2)
    except DataDirBusy as exc:
        return fail(str(exc))
    except GatewayError as exc:
        return fail(exc.message)
    except REDIS_FAILURES as exc:
        return fail(f"cannot reach Redis: {exc}")


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's own flush at exit cannot fail again
    (the idiom of Python's signal documentation, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
