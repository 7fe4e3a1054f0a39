"""What a client may ask of the cache through request headers, and what the answer says.

Request headers:

* ``Cache-Control: no-cache`` skips the lookup (and so the store: an answer is stored only
  under the purge epoch its lookup read, see store.py); ``no-store`` forbids storing the answer (RFC 9111: the lookup still
  happens); ``max-age=N`` accepts only an entry stored at most N seconds ago (``max-age=0``
  therefore skips the lookup). Other directives are ignored, as HTTP caches ignore them.
* ``x-switchyard-cache: bypass`` skips the lookup, like ``no-cache``. Any other value is a
  client error (``CacheHeaderError``, a 400 naming the header), so a typo is never silently
  ignored.

Every /v1 answer carries ``x-switchyard-cache``: ``hit`` (served from the cache), ``miss``
(looked up, not found: the answer may be stored) or ``bypass`` (not looked up: the client
asked, the model or task has no ``cache:`` block, or the request is not deterministic).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

CACHE_HEADER = "x-switchyard-cache"
HIT, MISS, BYPASS = "hit", "miss", "bypass"
REQUEST_VALUES = (BYPASS,)


class CacheHeaderError(ValueError):
    """A cache request header the gateway cannot honour; ``header`` names it."""

    def __init__(self, header: str, message: str) -> None:
        super().__init__(message)
        self.header = header
        self.message = message


@dataclass(frozen=True, slots=True)
class CacheDirective:
    """``lookup``: may a stored answer be served; ``store``: may this answer be stored;
    ``max_age_s``: the oldest entry the client accepts (None: any live entry)."""

    lookup: bool = True
    store: bool = True
    max_age_s: int | None = None


DEFAULT_DIRECTIVE = CacheDirective()


def directive_of(headers: Mapping[str, str]) -> CacheDirective:
    """The client's cache directive; raises ``CacheHeaderError`` on a bad value."""
    control = headers.get("cache-control")
    ours = headers.get(CACHE_HEADER)
    if not control and not ours:
        return DEFAULT_DIRECTIVE  # the common case: no allocation
    lookup, store, max_age = True, True, None
    if ours:
        value = ours.strip().lower()
        if value not in REQUEST_VALUES:
            raise CacheHeaderError(
                CACHE_HEADER, f"{CACHE_HEADER} must be one of: {', '.join(REQUEST_VALUES)}"
            )
        lookup = False
    for part in (control or "").split(","):
        name, _, argument = part.strip().partition("=")
        name = name.strip().lower()
        if name == "no-cache":
            lookup = False
        elif name == "no-store":
            store = False
        elif name == "max-age":
            seconds = _delta_seconds(argument)
            if seconds is not None:
                max_age = seconds if max_age is None else min(max_age, seconds)
    if max_age == 0:
        lookup = False
    return CacheDirective(lookup=lookup, store=store, max_age_s=max_age)


def _delta_seconds(text: str) -> int | None:
    """RFC 9111 delta-seconds; an unparsable value is ignored like an unknown directive."""
    text = text.strip().strip('"')
    if not text.isdigit() or not text.isascii():
        return None
    return int(text)
