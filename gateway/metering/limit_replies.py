"""What the limiter's reserve script answers, as a client sees it: ``x-ratelimit-*`` headers
and the 429 a refusal becomes.

The script returns, per scope (the key's, then its team's), each window's limit, use and reset;
the headers show, for requests and for tokens, the scope with the least room left, so a client
pacing itself by them never runs into the other. Messages name the limit that refused, and the
team when it was the team's. Money is nano-dollars here too; only the message renders it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gateway.errors import RateLimited
from gateway.money import format_usd_short

# A refusal that waiting cannot cure (rpm 0, a request bigger than the tpm, a spent total
# budget) still needs an integer Retry-After. Those, and waits longer than the window (a spent
# day or month budget), add x-should-retry: false, which the OpenAI SDKs obey.
NEVER_RETRY_AFTER_S = 86_400
STATS_PER_SCOPE = 6  # rpm limit, used, reset ms; tpm limit, used, reset ms


def format_duration(ms: float) -> str:
    """OpenAI's reset format: "20ms", "1s", "1.5s", "6m0s", "1h2m3s"."""
    ms = max(0, round(ms))
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{minutes}m{seconds}"
    return seconds


# Per window kind: its offset in a scope's stats, and its three header names.
_WINDOWS = tuple(
    (
        offset,
        f"x-ratelimit-limit-{kind}",
        f"x-ratelimit-remaining-{kind}",
        f"x-ratelimit-reset-{kind}",
    )
    for kind, offset in (("requests", 0), ("tokens", 3))
)


def rate_headers(stats: Sequence[Any]) -> dict[str, str]:
    """x-ratelimit-* for the windows some scope limits; a window no scope limits gets none.
    Of several scopes limiting a window, the first with the least room left is shown."""
    headers: dict[str, str] = {}
    for offset, limit_name, remaining_name, reset_name in _WINDOWS:
        shown = None
        for at in range(offset, len(stats), STATS_PER_SCOPE):
            limit = int(stats[at])
            if limit >= 0:
                used = int(stats[at + 1])
                if shown is None or limit - used < shown[0] - shown[1]:
                    shown = (limit, used, stats[at + 2])
        if shown is not None:
            limit, used, reset = shown
            headers[limit_name] = str(limit)
            headers[remaining_name] = str(max(0, limit - used))
            headers[reset_name] = format_duration(int(reset))
    return headers


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def refusal(
    reply: Sequence[Any], *, team: str | None, tokens: int, cost_nanos: int, window_ms: int
) -> RateLimited:
    """The 429 of a refused reserve: ``{0, reason, retry ms, now, scope, limit, used, held,
    period, stats...}`` (limits_reserve.lua)."""
    reason, retry_ms = _text(reply[1]), int(reply[2])
    scope, limit, used, held = int(reply[4]), int(reply[5]), int(reply[6]), int(reply[7])
    period = _text(reply[8])
    headers = rate_headers(reply[9:])
    if retry_ms < 0:
        headers["retry-after"] = str(NEVER_RETRY_AFTER_S)
    else:
        headers["retry-after"] = str(max(1, math.ceil(retry_ms / 1000)))
    if retry_ms < 0 or retry_ms > window_ms:
        headers["x-should-retry"] = "false"
    wait = "" if retry_ms < 0 else f" Retry in {format_duration(retry_ms)}."
    whose = f"this key's team {team!r}" if scope == 2 else "this key"
    of_team = f" of team {team!r}" if scope == 2 else ""
    if reason == "budget":
        message = (
            f"Budget exceeded: {whose} may spend {format_usd_short(limit)}"
            f" per {period if period != 'total' else 'lifetime'};"
            f" spent {format_usd_short(used)}, held by requests in flight"
            f" {format_usd_short(held)}, this request needs up to"
            f" {format_usd_short(cost_nanos)}.{wait}"
        )
        return RateLimited(
            message, error_type="insufficient_quota", code="insufficient_quota", headers=headers
        )
    code = "rate_limit_exceeded"
    if reason == "rpm":
        message = (
            f"Rate limit reached for requests per minute (rpm){of_team}: limit {limit},"
            f" used {used}.{wait}"
        )
    elif reason == "parallel":
        code = "too_many_parallel_requests"
        message = (
            f"Too many requests in flight (max_parallel_requests){of_team}: limit {limit},"
            f" in flight {used}.{wait}"
        )
    elif tokens > limit:
        message = (
            f"Request too large for tokens per minute (tpm){of_team}: limit {limit},"
            f" this request needs {tokens} tokens."
        )
    else:
        message = (
            f"Rate limit reached for tokens per minute (tpm){of_team}: limit {limit},"
            f" used {used}, this request needs {tokens}.{wait}"
        )
    return RateLimited(message, error_type="rate_limit_exceeded", code=code, headers=headers)
