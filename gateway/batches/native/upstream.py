"""What the runner asks of a provider's own batch API (``BatchApi``), whichever it is:
submit the requests of one upstream batch, find one submitted before a crash, poll it, read
its results, cancel it. ``openai.py`` (OpenAI's Files and Batch API) and ``anthropic.py``
(Anthropic's Message Batches) implement it over the provider the gateway already has for
interactive calls (``HttpProvider``): its base URL, key, headers, pooled session and error
scrubbing, so a batch call is authenticated and relayed exactly as a request is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gateway.errors import UpstreamError

# The metadata key an OpenAI upstream batch carries the gateway's own id under.
NATIVE_ID_METADATA = "switchyard_native_id"

Outcome = Literal["answered", "cancelled", "expired"]


@dataclass(frozen=True, slots=True)
class NativeRequest:
    """One request of an upstream batch: its ``custom_id`` (the line's) and its body in the
    provider's format, ``model`` the upstream model's name."""

    custom_id: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class UpstreamState:
    """An upstream batch as last polled: the provider's word for its status, whether it has
    ended, and where its results are once it has."""

    upstream_id: str
    status: str
    ended: bool
    output_file_id: str | None = None  # OpenAI
    error_file_id: str | None = None  # OpenAI
    results_url: str | None = None  # Anthropic


@dataclass(frozen=True, slots=True)
class NativeResult:
    """One request's result: ``answered`` with the provider's status and body (an answer,
    or its error in its own envelope), or never run: ``cancelled``, ``expired``."""

    custom_id: str
    outcome: Outcome
    status: int = 0
    body: bytes = b""


class BatchApi(Protocol):
    async def submit(self, native_id: str, endpoint: str, requests: Sequence[NativeRequest]) -> str:
        """Create the upstream batch (``endpoint``: the gateway batch's ``/v1`` path); the
        provider's batch id. ``native_id`` goes with it where the API keeps metadata."""
        ...

    async def find(self, native_id: str, since_ms: int) -> str | None:
        """The id of an upstream batch created for ``native_id`` since ``since_ms`` (a
        submission whose answer was lost), or None: none, or the API cannot tell."""
        ...

    async def poll(self, upstream_id: str) -> UpstreamState: ...

    async def results(self, state: UpstreamState) -> list[NativeResult]:
        """Every result of an ended upstream batch."""
        ...

    async def cancel(self, upstream_id: str) -> None: ...

    def error(self, status: int, body: bytes) -> UpstreamError:
        """A request's error result as the gateway relays an interactive one (scrubbed)."""
        ...
