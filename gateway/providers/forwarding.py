"""Which of a client's headers go on to a provider.

Always the request id (the gateway's own ``x-request-id``: the client's when it sent a valid
one) and the W3C trace context (``traceparent``, ``tracestate``), so one id follows a request
through every hop; beyond those only the provider's ``forward_headers`` allow-list
(``anthropic-beta``, ``openai-organization`` ...). Hop-by-hop and credential headers
(``routing.policy.never_forwarded``: authorization, x-api-key, api-key, cookie, proxy-*,
connection, te, upgrade, host, content-length, transfer-encoding, ...) never go, whatever the
list says: the provider's own credentials are added by the provider itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gateway.routing.policy import never_forwarded

REQUEST_ID = "x-request-id"
TRACE_CONTEXT = ("traceparent", "tracestate")


def forwarded_headers(
    client: Mapping[str, str], allow: Iterable[str], request_id: str
) -> dict[str, str]:
    """The headers to send upstream from ``client`` (a case-insensitive mapping, as
    Starlette's ``Headers``), with lower-case names."""
    out = {REQUEST_ID: request_id}
    for name in (*TRACE_CONTEXT, *allow):
        lowered = name.lower()
        if never_forwarded(lowered) or lowered == REQUEST_ID:
            continue
        value = client.get(lowered)
        if value is not None:
            out[lowered] = value
    return out
