"""The Anthropic front door: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Anthropic's SDKs (and everything built on them) talk to the gateway as they would to
Anthropic: the key as ``x-api-key`` (or a bearer), ``anthropic-version`` accepted (any value:
the gateway speaks the one Messages format), answers and streams in Anthropic's shape with its
SSE event types, and every error in Anthropic's envelope, authentication and rate limits
included. The request goes through the one pipeline: to an Anthropic provider untouched
(``model`` replaced), to any other provider translated (``gateway/formats``). Token counting
goes only to providers that offer it (kind ``anthropic``) and is not charged.
"""

from __future__ import annotations

from gateway.api.v1.doors import COUNT_TOKENS, MESSAGES
from gateway.api.v1.pipeline import door_route

routes = [door_route(MESSAGES), door_route(COUNT_TOKENS)]
