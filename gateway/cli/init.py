"""``switchyard init [--force]``: write the shipped default policy, as an editable
``routing_rules.yaml`` (or ``SWITCHYARD_POLICY_FILE``), where ``serve`` will read it.

An existing file is never overwritten without ``--force``. The copy is written to a temporary
file beside the target and renamed into place, so a running gateway's watcher never reads half
of it (it reloads the new file within a second).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

from gateway.cli.output import fail
from gateway.settings import SHIPPED_POLICY, Settings


def add_init_parser(commands: Any) -> None:
    init = commands.add_parser("init", help="write an editable copy of the default policy")
    init.add_argument("--force", action="store_true", help="overwrite an existing policy file")


def init_command(settings: Settings, args: argparse.Namespace) -> int:
    target = settings.policy_file
    if target.exists() and not args.force:
        return fail(f"{target} exists; keep it, or overwrite it with `switchyard init --force`")
    try:
        directory = target.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(SHIPPED_POLICY.read_text(encoding="utf-8"))
        os.chmod(temp_name, 0o644)  # a policy holds no secrets (keys come from the environment)
        os.replace(temp_name, target)
    except OSError as exc:
        return fail(f"cannot write {target}: {exc.strerror}")
    print(f"wrote {target}: the default policy; edit it, then `switchyard serve` (docs/routing.md)")
    return 0
