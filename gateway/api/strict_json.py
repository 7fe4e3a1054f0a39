"""Strict JSON for request bodies: one meaning per document, or a 400 that says why.

orjson already rejects invalid UTF-8, lone surrogates and the NaN/Infinity literals. It keeps
the last of duplicate keys silently, and two parsers reading ``{"model": "a", "model": "b"}``
(say a WAF and us) may disagree on what was asked, so duplicates are refused too.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from gateway.errors import InvalidRequest


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    mapping = dict(pairs)
    if len(mapping) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return mapping


def _reject_duplicates(text: str) -> None:
    # The C scanner calls the hook once per object: a few microseconds for a chat request.
    try:
        json.loads(text, object_pairs_hook=_unique_pairs)
    except _DuplicateKey as exc:
        raise InvalidRequest(
            f"the request body has the key {exc.key!r} more than once in one object"
        ) from None
    except RecursionError:
        raise InvalidRequest("the request body is nested too deeply") from None


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; InvalidRequest for anything ambiguous or malformed."""
    if not raw.strip():
        raise InvalidRequest("the request body is empty; send a JSON object")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object")
    # orjson accepted it, so it is valid UTF-8 and decoding cannot fail.
    _reject_duplicates(raw.decode())
    return data
