"""What an audit entry may keep of a value: everything but secrets.

Callers pass public views (a key's, a team's, a token's), which hold no secret already; this is
the second line. Fields whose name says secret (``key``, ``token``, ``secret_hash``, ...) are
dropped at any depth, and any string shaped like a credential (an API key ``sk-sy-...``, a
named admin token ``sy-tok-...``, the bootstrap admin key ``sy-admin-...``, or anything
``gateway.redact`` recognises) is replaced by ``[redacted]``.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.redact import REDACTED, redact

SECRET_FIELDS = frozenset(
    {
        "key",
        "token",
        "secret",
        "secret_hash",
        "previous_hash",
        "rotation_salt",
        "admin_key",
        "api_key",
        "password",
        "authorization",
    }
)
_SECRET_PREFIXES = ("sk-sy-", "sy-tok-", "sy-admin-")
MAX_VALUE_BYTES = 16_384


def scrubbed(value: Any) -> Any:
    """``value`` without secret fields or credential-shaped strings."""
    if isinstance(value, dict):
        return {
            str(name): scrubbed(item)
            for name, item in value.items()
            if str(name).lower() not in SECRET_FIELDS
        }
    if isinstance(value, list | tuple):
        return [scrubbed(item) for item in value]
    if isinstance(value, str):
        if value.startswith(_SECRET_PREFIXES):
            return REDACTED
        return redact(value, (), limit=len(value)) if len(value) >= 8 else value
    return value


def audit_json(value: Any) -> str | None:
    """The scrubbed value as JSON text for the audit table (None stays None)."""
    if value is None:
        return None
    text = orjson.dumps(scrubbed(value), option=orjson.OPT_SORT_KEYS)
    if len(text) > MAX_VALUE_BYTES:
        return orjson.dumps({"truncated": True, "bytes": len(text)}).decode()
    return text.decode()
