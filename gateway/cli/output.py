"""How every ``switchyard`` command answers: JSON or an aligned table on stdout, one ``error:``
line on stderr."""

from __future__ import annotations

import sys
from collections.abc import Sequence
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


def columns(header: Sequence[str], rows: Sequence[Sequence[str]], *, left: int) -> list[str]:
    """``header``, a rule and ``rows`` as aligned lines: the first ``left`` cells of each line
    left-aligned (names), the others right-aligned (numbers)."""
    widths = [max(len(line[i]) for line in (header, *rows)) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        aligned = (
            cell.ljust(width) if index < left else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        )
        return "  ".join(aligned).rstrip()

    return [line(header), "  ".join("-" * width for width in widths), *map(line, rows)]
