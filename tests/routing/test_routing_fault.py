"""Which failed upstream tries count against the breaker every tenant shares (routing/fault.py).

The errors are the ones the real HTTP client makes of an upstream's answer
(``HttpUpstream.error_from_status``, ``connect_error``, ``timeout_error``), so the decision is
checked on what the dispatcher is really handed.
"""

from __future__ import annotations

import pytest

from gateway.errors import UpstreamError
from gateway.providers.http_upstream import HttpUpstream
from gateway.routing.fault import counts_against_breaker
from gateway.settings import UpstreamSettings

UPSTREAM = HttpUpstream(
    "p", UpstreamSettings(connect_timeout_s=1.0, read_timeout_s=1.0, total_timeout_s=1.0)
)
ENVELOPE = b'{"error": {"message": "no", "type": "invalid_request_error", "code": null}}'


@pytest.mark.parametrize(
    ("status", "counts"),
    [
        # The provider is broken, or out of rate for the gateway's account: for every tenant.
        (500, True),
        (502, True),
        (503, True),
        (529, True),
        (408, True),
        (429, True),
        (401, True),  # the gateway's own credential was refused: every request fails so
        # What the client sent: the operation, the body, the headers it forwarded.
        (400, False),
        (403, False),  # a valid credential not allowed this request (a beta, a resource)
        (404, False),  # a path the client's operation chose, an id its body names
        (409, False),
        (413, False),
        (422, False),
    ],
)
def test_an_upstream_answer_counts_only_when_it_is_the_providers_fault(
    status: int, counts: bool
) -> None:
    error = UPSTREAM.error_from_status(status, ENVELOPE)
    assert counts_against_breaker(error) is counts


def test_no_answer_counts_and_an_oversized_or_unsent_one_does_not() -> None:
    assert counts_against_breaker(UPSTREAM.connect_error(ConnectionResetError()))
    assert counts_against_breaker(UPSTREAM.timeout_error())
    assert counts_against_breaker(UPSTREAM.protocol_error("sent a body that is not JSON"))
    # As large as the request asked for: a client can make the answer pass the gateway's cap.
    assert not counts_against_breaker(UPSTREAM._too_large("a body", 1024))
    # Refused before anything was sent (an upload already spent on another candidate).
    spent = UpstreamError("spent", status=502, retryable=False, kind="spent", final=True)
    assert not counts_against_breaker(spent)
