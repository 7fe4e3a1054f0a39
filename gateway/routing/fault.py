"""Whose fault a failed upstream try is, for the circuit breaker shared by every tenant.

A breaker is keyed by provider/model, not by API key: one key's failures close the model to
all of them. So only a failure that says the provider is broken for everyone, whatever was sent,
counts against it:

- no answer, or a broken one: connect errors, timeouts, answers that break their own format
  or streams cut short (kinds ``connect``, ``timeout``, ``protocol``);
- an upstream 5xx (the gateway's 502 by then), and the local engine's own failures;
- 408 and 429 (the retryable 4xx): the provider is out of time or rate for the gateway's
  account, which every tenant shares;
- 401: the provider refused the gateway's own credential, which is the same for every request.

Everything a client can bring about by what it sends does not count: every other 4xx, a 403
(the gateway's key is valid but not allowed *this* request: a beta feature in a forwarded
header, a resource the body names) and a 404 (a path or model the client's operation chose, a
file or response id the body names). Those still move on to the next candidate where the
dispatcher treats them as configuration errors (``dispatch.CONFIG_STATUSES``); they only leave
the breaker alone. Nor does an answer larger than the gateway's cap (its size follows from what
was asked), nor a try that never reached the upstream (an upload already spent on another
candidate).
"""

from __future__ import annotations

from gateway.errors import UpstreamError

# The 4xx answers that are about the provider and the gateway's account, not the request.
_SHARED_4XX = frozenset({408, 429})
# Failures with no (readable) answer from the provider.
_NO_ANSWER_KINDS = frozenset({"connect", "timeout", "protocol"})


def counts_against_breaker(error: UpstreamError) -> bool:
    """Does this failed try say the candidate is broken for every tenant?"""
    if error.code == "upstream_response_too_large":  # as large as the request asked for
        return False
    if error.kind in _NO_ANSWER_KINDS:
        return True
    if error.kind == "spent":  # refused before it was sent: the upstream said nothing
        return False
    if error.kind == "auth":  # the gateway's credential refused: 401 always, 403 for this request
        return error.upstream_status == 401
    answered = error.upstream_status if error.upstream_status is not None else error.status
    return answered >= 500 or answered in _SHARED_4XX
