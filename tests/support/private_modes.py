"""What docs/configuration.md promises of DATA_DIR: folders 0700, files 0600."""

from __future__ import annotations

import stat
from pathlib import Path


def private_modes_problems(root: Path) -> list[str]:
    """Every entry under ``root`` (itself included) that others could read or enter."""
    problems = []
    for path in [root, *sorted(root.rglob("*"))]:
        info = path.lstat()
        mode = stat.S_IMODE(info.st_mode)
        if stat.S_ISLNK(info.st_mode):
            continue  # a link's own mode means nothing; its target is checked where it lives
        if stat.S_ISDIR(info.st_mode):
            expected = 0o700
        elif stat.S_ISREG(info.st_mode):
            expected = 0o600
        else:  # the Redis socket: no access for others is what matters
            expected = mode & 0o700
        if mode != expected:
            problems.append(f"{oct(mode)} {path.relative_to(root.parent)}")
    return problems
