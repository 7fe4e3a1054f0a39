"""Money as integer nano-dollars (1e-9 USD): exact reading of decimal amounts, exact rendering.

Everything the gateway adds up (prices, budgets, budget holds, usage costs, report totals) is an
``int`` of nano-dollars, so sums never round. ``Decimal`` appears only where a person-written
amount is read (a policy price, a key's ``budget_usd``), never per request; a float appears only
as a rendering. A price is USD per 1M tokens, so a whole number of nano-dollars per token allows
at most 3 decimal places in it (0.15 -> 150 nano-dollars a token); a budget allows at most 9.
"""

from __future__ import annotations

import math
from decimal import ROUND_FLOOR, Decimal, InvalidOperation

NANOS_PER_USD = 1_000_000_000
# Usage aggregates and budget hashes written before the nano-dollar unit held micro-dollars.
NANOS_PER_MICRO = 1_000
# A price is USD per 1M tokens: nano-dollars per token = price x 1e9 / 1e6.
NANOS_PER_TOKEN_PER_PRICE_UNIT = 1_000
# Lua numbers are doubles: integers stay exact below 2**53 (about $9.007M in nano-dollars).
MAX_SAFE_NANOS = 2**53 - 1
MAX_BUDGET_USD = 9_000_000
MAX_BUDGET_NANOS = MAX_BUDGET_USD * NANOS_PER_USD
MAX_PRICE_PER_MTOK = 1_000_000  # $1 a token; keeps every per-request estimate far from int64


def exact_decimal(value: object) -> Decimal:
    """The decimal a person wrote: ints as they are, floats by their shortest repr (what YAML
    or JSON text like ``0.15`` parses to), strings and Decimals as given. Raises ValueError for
    booleans, non-numbers, NaN and infinities."""
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise ValueError(f"must be a number, got {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number, got {value!r}")
        return Decimal(repr(value))
    try:
        number = Decimal(value) if not isinstance(value, str) else Decimal(value.strip())
    except InvalidOperation:
        raise ValueError(f"must be a number, got {value!r}") from None
    if not number.is_finite():
        raise ValueError(f"must be a finite number, got {value!r}")
    return number


def usd_to_nanos(value: object) -> int:
    """An exact USD amount (at most 9 decimal places) in nano-dollars; ValueError otherwise."""
    number = exact_decimal(value)
    if number < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    nanos = number.scaleb(9)
    if nanos != nanos.to_integral_value():
        raise ValueError(
            f"must be a whole number of nano-dollars (at most 9 decimal places), got {value!r}"
        )
    return int(nanos)


def stored_usd_to_nanos(value: float) -> int:
    """A budget stored before amounts were checked: rounded down to a nano-dollar and capped at
    ``MAX_BUDGET_NANOS``, so an old record still loads and never grants more than it said."""
    number = exact_decimal(value)
    nanos = int(number.scaleb(9).to_integral_value(ROUND_FLOOR))
    return min(max(nanos, 0), MAX_BUDGET_NANOS)


def price_to_nanos_per_token(value: object) -> int:
    """A price in USD per 1M tokens as whole nano-dollars per token; ValueError when the price
    has more than 3 decimal places (its per-token cost would not be a whole nano-dollar)."""
    number = exact_decimal(value)
    if number < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    if number > MAX_PRICE_PER_MTOK:
        raise ValueError(f"must be at most {MAX_PRICE_PER_MTOK} USD per 1M tokens")
    per_token = number.scaleb(3)
    if per_token != per_token.to_integral_value():
        raise ValueError(
            "must have at most 3 decimal places (USD per 1M tokens), so that every token costs"
            f" a whole number of nano-dollars; got {value!r}"
        )
    return int(per_token)


def tokens_cost_nanos(
    rates: tuple[int, int, int, int],
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
    cache_write_tokens: int = 0,
) -> int:
    """The exact cost of a request's tokens at ``rates`` (nano-dollars a token for input,
    output, cache reads and cache writes). ``prompt_tokens`` counts every input token; of
    them, the cache reads and writes cost their own rates and the rest the input rate."""
    input_rate, output_rate, cached_rate, written_rate = rates
    prompt = max(prompt_tokens, 0)
    cached = min(max(cached_tokens, 0), prompt)
    written = min(max(cache_write_tokens, 0), prompt - cached)
    return (
        (prompt - cached - written) * input_rate
        + cached * cached_rate
        + written * written_rate
        + completion_tokens * output_rate
    )


def nanos_to_usd(nanos: int) -> float:
    """A float rendering for JSON convenience; the integer stays the authoritative figure."""
    return nanos / NANOS_PER_USD


def format_usd_exact(nanos: int) -> str:
    """Fixed-point USD with all 9 decimals, computed from the integer: ``0.001692000``."""
    sign = "-" if nanos < 0 else ""
    whole, frac = divmod(abs(nanos), NANOS_PER_USD)
    return f"{sign}{whole}.{frac:09d}"


def format_usd_short(nanos: int) -> str:
    """``$0.0009936``, ``$5``: exact, trailing zeros dropped (for messages)."""
    text = format_usd_exact(nanos).rstrip("0").rstrip(".")
    return f"${text}"


def format_usd_money(nanos: int) -> str:
    """``$50.00``, ``$0.125``: at least the cents, and every further digit the integer has
    (exact: a sub-cent price is never rounded away)."""
    sign = "-" if nanos < 0 else ""
    whole, frac = format_usd_exact(abs(nanos)).split(".")
    frac = frac.rstrip("0").ljust(2, "0")
    return f"{sign}${whole}.{frac}"
