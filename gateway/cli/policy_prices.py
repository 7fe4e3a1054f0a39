"""``switchyard policy prices [FILE]``: the price each model is costed at, and its source.

A table (``--json``: the rows) of USD per 1M tokens for input, output, cache reads and cache
writes, and where the price comes from: ``policy``, the price catalogue's version (with the
catalogue's name of the model; ``*`` marks a price with higher tiers for long prompts, ``^``
one rounded up to a whole nano-dollar a token), or ``none``. The policy text is parsed here,
so the rows are those the gateway computes from it (``gateway/routing/price_view.py``).
"""

from __future__ import annotations

from typing import Any

from gateway.cli.output import answer, columns, fail
from gateway.policy import PolicyError, parse_policy
from gateway.routing.price_view import FIELDS, price_table

HEADER = ("model", "provider", "upstream model", "source")
PRICE_HEADER = ("input", "output", "cache read", "cache write")


def print_prices(text: str, where: str, *, as_json: bool) -> int:
    try:
        rows = price_table(parse_policy(text))
    except PolicyError as exc:
        return fail(f"{where}: {exc.path or '(file)'}: {exc.message}")
    if as_json:
        return answer(rows)
    table = [_cells(row) for row in rows]
    for line in columns((*HEADER, *PRICE_HEADER), table, left=len(HEADER)):
        print(line)
    if any("tiers" in row for row in rows):
        print("* higher prices past a prompt size (--json shows the tiers)")
    if any("rounded_up_from" in row for row in rows):
        print("^ the catalogue's price rounded up to a whole nano-dollar a token")
    return 0


def _cells(row: dict[str, Any]) -> list[str]:
    rounded = row.get("rounded_up_from", {})
    prices = [row[name] + ("^" if name in rounded else "") for name in FIELDS]
    source = row["source"]
    if "catalogue_model" in row:
        source += f" ({row['catalogue_model']}{'*' if 'tiers' in row else ''})"
    return [row["model"], row["provider"], row["upstream_model"], source, *prices]
