"""Which of a client's headers go on to a provider.

Always the request id (the gateway's own ``x-request-id``: the client's when it sent a valid
one) and the W3C trace context (``traceparent``, ``tracestate``), so one id follows a request
through every hop; beyond those only the provider's ``forward_headers`` allow-list
(``anthropic-beta``, ``openai-organization`` ...). Hop-by-hop and credential headers
(``gateway.policy.never_forwarded``: authorization, x-api-key, api-key, cookie, proxy-*,
connection, te, upgrade, host, content-length, transfer-encoding, ...) never go, whatever the
list says: the provider's own credentials are added by the provider itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gateway.policy import never_forwarded

REQUEST_ID = "x-request-id"
TRACE_CONTEXT = ("traceparent", "tracestate")


def forwarded_headers(
    client: Mapping[str, str], allow: Iterable[str], request_id: str
) -> dict[str, str]:
    """The headers to send upstream from ``client`` (a case-insensitive mapping, as
    Starlette's ``Headers``), with lower-case names."""
    out = {REQUEST_ID: request_id}
    out.update(_present(client, TRACE_CONTEXT))
    out.update(listed_headers(client, allow))
    return out


def listed_headers(client: Mapping[str, str], allow: Iterable[str]) -> dict[str, str]:
    """The allow-listed headers ``client`` sent, as they go upstream (lower-case names): what
    can change a provider's answer, so the response cache keys on them. The request id and
    trace context, which only name the request, are not among them."""
    wanted = (name.lower() for name in allow)
    return _present(
        client,
        (n for n in wanted if not never_forwarded(n) and n not in (REQUEST_ID, *TRACE_CONTEXT)),
    )


def _present(client: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in names:
        value = client.get(name)
        if value is not None:
            out[name] = value
    return out
