"""The ``x-switchyard-*`` request headers the gateway reads, and the refusal of any other.

A client header under the gateway's own prefix that it does not read is almost always a typo
or a guess (``x-switchyard-task`` for ``X-Task-Type``, ``x-switchyard-tag``): ignoring it would
let the mistake pass silently, so it is a 400 naming it, on every /v1 door (in the door's
error envelope: Anthropic's on /v1/messages) and every /admin route, before anything else is
read. The same goes for the headers a route explanation (``/admin/route/explain``) is given.
The headers the gateway sends (``x-switchyard-route``, ``-model``, ``-provider``,
``-usage-id``, ``-cache`` on answers; ``-signature``, ``-timestamp``, ``-alert-id`` on alert
webhooks) are answers, not requests: a client sending one of those is refused too.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

from gateway.api.envelopes import error_response
from gateway.cache.controls import CACHE_HEADER
from gateway.errors import InvalidRequest
from gateway.formats.internal import FormatName
from gateway.metering.attribution import TAGS_HEADER, USER_HEADER
from gateway.server.header_map import header_map

PREFIX = "x-switchyard-"
# Every x-switchyard-* header a request may carry (docs/cache.md, docs/usage.md).
REQUEST_HEADERS = frozenset({CACHE_HEADER, TAGS_HEADER, USER_HEADER})
# Those the gateway only sends: on /v1 answers, and on budget alert webhooks (limits.md).
SENT_HEADERS = frozenset(
    {
        "x-switchyard-route",
        "x-switchyard-model",
        "x-switchyard-provider",
        "x-switchyard-usage-id",
        CACHE_HEADER,
        "x-switchyard-alert-id",
        "x-switchyard-timestamp",
        "x-switchyard-signature",
    }
)
# Where the refusal applies; the Anthropic doors answer in Anthropic's envelope.
_GUARDED = ("/v1/", "/admin/")
_ANTHROPIC_PATHS = ("/v1/messages",)


def unknown_headers(names: Iterable[str]) -> list[str]:
    """The ``x-switchyard-*`` names (lower-cased) among ``names`` that the gateway does not read."""
    found = {name.lower() for name in names}
    return sorted(n for n in found if n.startswith(PREFIX) and n not in REQUEST_HEADERS)


def unknown_request_headers(scope: MutableMapping[str, Any]) -> list[str]:
    """``unknown_headers`` of a request, read from its header map (which the route reads later
    anyway): most requests carry no header under the prefix, and are done after one pass."""
    names = header_map(scope)
    if not any(name.startswith(PREFIX) for name in names):
        return []
    return unknown_headers(names)


def refusal(unknown: list[str], where: str = "") -> InvalidRequest:
    """The 400 for ``unknown`` headers; ``where`` prefixes the param (``headers.`` in a body)."""
    known = ", ".join(sorted(REQUEST_HEADERS))
    listed = ", ".join(unknown)
    return InvalidRequest(
        f"unknown header{'s' if len(unknown) > 1 else ''} {listed}: the gateway reads only "
        f"{known} (the task header is X-Task-Type)",
        param=where + unknown[0],
        code="unknown_header",
    )


def check_headers(names: Iterable[str], where: str = "") -> None:
    """Raise the 400 when ``names`` hold an ``x-switchyard-*`` header the gateway does not read."""
    unknown = unknown_headers(names)
    if unknown:
        raise refusal(unknown, where)


def _client_format(path: str) -> FormatName:
    return "anthropic_messages" if path.startswith(_ANTHROPIC_PATHS) else "openai_chat"


class HeaderGuardMiddleware:
    """Pure ASGI middleware: refuse /v1 and /admin requests with unknown x-switchyard-* headers."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(_GUARDED):
            unknown = unknown_request_headers(scope)
            if unknown:
                response = error_response(_client_format(scope["path"]), refusal(unknown))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
