"""A request's headers as one plain dict, built once per request and kept in its scope.

Starlette's ``Headers`` scans the raw header list on every lookup, lower-casing and encoding
the name each time, and a missing header costs a ``KeyError`` raised and caught inside
``Mapping.get``. A /v1 request looks up about ten headers (its credential, request id,
attribution, cache directive, routing and forwarded headers), most of them absent: with the
helpers that make them, 13–15 µs through ``Headers`` against 7 µs with the dict built
(``python -m bench.request_pieces``).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

_HEADER_MAP_KEY = "switchyard.header_map"


def header_map(scope: MutableMapping[str, Any]) -> Mapping[str, str]:
    """The request's headers by lower-case name. A name sent twice reads as its first value,
    as ``Headers.get`` does; ``Headers.getlist`` is still the way to read every value."""
    known = scope.get(_HEADER_MAP_KEY)
    if known is None:
        known = scope[_HEADER_MAP_KEY] = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in reversed(scope["headers"])
        }
    return known
