"""How every ``switchyard`` command answers: JSON on stdout, one ``error:`` line on stderr."""

from __future__ import annotations

import sys
from typing import Any

import orjson


def print_json(data: Any) -> None:
    print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


def answer(data: Any) -> int:
    """Print ``data`` as the command's answer; the exit status (0) to return."""
    print_json(data)
    return 0


def fail(message: str, code: int = 1) -> int:
    """Say what went wrong in one line; the exit status to return."""
    print(f"error: {message}", file=sys.stderr)
    return code
