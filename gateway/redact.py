"""Text from elsewhere (an upstream's error body, an exception's message) made safe to relay.

``redact(text, secrets)`` replaces every given secret value (a provider's API key, its extra
header values) and anything shaped like a credential: ``Bearer …``/``Basic …`` values,
``sk-…``-style keys, ``api_key=…``/``"x-api-key": "…"`` values, JWTs, cloud access keys, and
long random-looking tokens (32+ characters mixing letters and digits; request ids that look like
that go too: better one id too many than one key). The result is cut to ``limit`` characters
(``MAX_RELAYED_CHARS`` unless told), so a client or a log line never carries more than a short,
scrubbed excerpt of what an upstream said.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

REDACTED = "[redacted]"
# What a client may see of an upstream's error text, and the most of it ever scanned.
MAX_RELAYED_CHARS = 300
_SCAN_CHARS = 8192
_MIN_SECRET_CHARS = 8

_CREDENTIAL = re.compile(
    r"""
      (?P<scheme>\b(?:[Bb]earer|BEARER|[Bb]asic|BASIC)\s+)[A-Za-z0-9._~+/=-]{6,}
    | (?P<name>(?i:\b(?:x-)?api[-_]?key|\baccess[-_]?token|\bauth[-_]?token|\brefresh[-_]?token
          |\bclient[-_]?secret|\bsecret|\bpassword|\bpasswd|\btoken)
        ["']?\s*[:=]\s*["']?)[^\s"',;&}\]]{4,}
    | \b(?:sk|pk|rk|sess)-[A-Za-z0-9_-]{8,}
    | \beyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]*
    | \b(?:AKIA|ASIA)[0-9A-Z]{16}\b
    | \bAIza[0-9A-Za-z_-]{20,}
    | \bgh[pousr]_[A-Za-z0-9]{20,}
    | \bxox[abprs]-[A-Za-z0-9-]{10,}
    | (?<![A-Za-z0-9_+/=-])(?=[A-Za-z0-9_+/=-]*[0-9])(?=[A-Za-z0-9_+/=-]*[A-Za-z])
        [A-Za-z0-9_+/=-]{32,}
    """,
    re.VERBOSE,
)


def _replace(match: re.Match[str]) -> str:
    keep = match.group("scheme") or match.group("name") or ""
    return keep + REDACTED


def redact(text: str, secrets: Iterable[str] = (), limit: int = MAX_RELAYED_CHARS) -> str:
    """``text`` with ``secrets`` and credential-shaped strings replaced, at most ``limit``
    characters long (an ellipsis marks a cut)."""
    scanned = text[:_SCAN_CHARS]
    for secret in sorted({s for s in secrets if len(s) >= _MIN_SECRET_CHARS}, key=len)[::-1]:
        scanned = scanned.replace(secret, REDACTED)
    scanned = _CREDENTIAL.sub(_replace, scanned)
    if len(scanned) > limit or len(text) > _SCAN_CHARS:
        return scanned[: max(limit - 1, 0)].rstrip() + "…"
    return scanned


def secret_values(
    api_key_env: str | None, headers: Mapping[str, str], env: Mapping[str, str]
) -> tuple[str, ...]:
    """The values a provider's requests carry that must never be echoed: its API key (read
    from ``env``) and every extra header value it sends (``api-key``, org ids and the like)."""
    values = [value for value in headers.values() if value]
    if api_key_env and env.get(api_key_env):
        values.append(env[api_key_env])
    return tuple(values)
