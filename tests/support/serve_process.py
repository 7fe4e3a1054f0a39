"""``switchyard serve`` as a child process, for the benchmarks and the tests' gateway processes:
its environment is this process's without any ``SWITCHYARD_*`` variable, plus the settings
given, and its output is appended to a log file."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def serve_env(settings: Mapping[str, str]) -> dict[str, str]:
    """This process's environment less its ``SWITCHYARD_*`` variables (a developer's own must
    not leak into the child), then ``settings``."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("SWITCHYARD_")}
    env.update(settings)
    return env


def launch_serve(env: Mapping[str, str], cwd: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """``python -m gateway serve`` run from ``cwd`` (no stray .env of a checkout is read), not
    waited for; stdout and stderr appended to ``log_path``."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve"],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
