"""What every stream relay keeps while an upstream stream goes to a client, whatever the formats.

``RelayProgress`` holds the counters the gateway meters (``usage`` so far, ``produced``: output
pieces seen, about one token each), whether the stream reached its format's end (``finished``)
and the ``error`` that ended it: an error event (``stop(info)``) or the upstream's body ending
before the format's end (``close()``, for relays that pass bytes through: there is nothing left
to send, only the early end to record).
"""

from __future__ import annotations

from gateway.formats.errors import ErrorInfo
from gateway.formats.internal import Usage

ENDED_EARLY = "the upstream stream ended early"


class RelayProgress:
    def __init__(self) -> None:
        self.usage: Usage | None = None
        self.produced = 0
        self.finished = False
        self.error: ErrorInfo | None = None

    def stop(self, error: ErrorInfo) -> None:
        """An error event ended the stream (nothing of it is sent: the caller scrubs it)."""
        self.error, self.finished = error, True

    def close(self) -> bytes:
        """The upstream's body ended: an early end unless the format's end came first."""
        if not self.finished:
            self.stop(ErrorInfo(502, ENDED_EARLY, "api_error"))
        return b""
