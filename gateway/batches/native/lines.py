"""The seam between a native batch line and the pipeline: ``NativeLines``.

As ``LineRunner`` for the lines the gateway runs itself (``gateway/batches/lines.py``), the
pipeline's side lives with the API (``gateway/api/v1/native_line.py``) and is passed in, so the
batch part knows of the pipeline only this:

- ``route``: where the pipeline would send a line (the first candidate of its plan, an alias
  resolved as usual) when that is a ``batch: native`` provider speaking the line's own format,
  with the line's budget hold taken (``NativeRoute``); None: the line runs through the
  pipeline as any other (another provider, a cross-format route, or a line the pipeline will
  refuse: a revoked key, a bad body, a spent budget, each answered there as usual);
- ``batch_api``: the provider's batch API (``BatchApi``), over the provider the pipeline uses;
- ``upstream_body``: the line's body as the provider gets it (its model the upstream's, the
  model's policy defaults in), or None when it can no longer go there;
- ``record``: a line's result from the provider's batch, ended as a request of the batch's key
  (its usage event, tagged and priced as a batch line, its budget hold settled), answered as
  the pipeline answers (``LineResult``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from gateway.batches.lines import LineCall, LineResult
from gateway.batches.native.upstream import BatchApi
from gateway.errors import UpstreamError
from gateway.metering.limits import Reservation


@dataclass(frozen=True, slots=True)
class NativeRoute:
    provider: str
    model: str  # the policy's model the route chose
    hold: Reservation | None  # the line's budget hold (None: the key has no budget to hold)


@dataclass(frozen=True, slots=True)
class NativeOutcome:
    """What a line got from the provider's batch, to be recorded as a request of the key."""

    route: NativeRoute
    record_id: str  # the usage event's id: the same however often the line is recorded
    status: int
    body: bytes  # the answer (2xx), or the provider's error body
    error: UpstreamError | None = None  # not 2xx: the error as the gateway relays it


class NativeLines(Protocol):
    def native_providers(self) -> frozenset[str]:
        """The policy's ``batch: native`` providers now (empty: none, or no policy)."""
        ...

    async def route(self, line: LineCall, *, hold_id: str, hold_ms: int) -> NativeRoute | None:
        """``hold_id``: the budget hold's request id (the same when the line is routed again
        after a crash, so the hold is the one taken before); held for ``hold_ms``."""
        ...

    def batch_api(self, provider: str) -> BatchApi | None: ...

    async def upstream_body(self, line: LineCall, route: NativeRoute) -> dict[str, Any] | None: ...

    async def record(self, line: LineCall, outcome: NativeOutcome) -> LineResult: ...
