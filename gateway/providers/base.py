"""What every provider is to the rest of the gateway: the ``Provider`` protocol and the values
it trades in. Implementations live beside it (``openai_compat.py``, ``local_host.py``); this
file holds only the interface, so the request path and the dispatcher never ask which kind of
provider they hold.

A provider answers a JSON request (``post_json`` → ``UpstreamResponse``) or opens a stream
(``open_stream`` → ``UpstreamStream``: raw SSE ``data`` payloads, ``[DONE]`` last), raising
``UpstreamError`` for anything that went wrong. ``unavailable()`` says, before any call, why it
cannot take a request now (``None``: it can); ``spill`` marks a provider that is only busy, which
the dispatcher tries again after the other candidates. A provider that chose among replicas says
which one and why in ``route_note`` (on the response or the stream); the request path appends
it to ``x-switchyard-route``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Timeouts:
    """Upstream HTTP limits in seconds: to connect, between bytes, and for the whole request."""

    connect_s: float
    read_s: float
    total_s: float


@dataclass(frozen=True)
class UpstreamResponse:
    status: int
    body: bytes
    data: dict[str, Any]
    route_note: str | None = None  # e.g. "replica=10.0.0.5:8000 (affinity)" (a fleet's pick)


@dataclass(frozen=True)
class Unavailable:
    """Why a provider cannot take a request now; ``spill`` = only because it is busy."""

    detail: str
    spill: bool


class UpstreamStream(Protocol):
    route_note: str | None  # as ``UpstreamResponse.route_note``; None for a single upstream

    def events(self) -> AsyncIterator[bytes]:
        """Each event's data, ``[DONE]`` included; raises ``UpstreamError`` if cut short."""
        ...

    def close(self) -> None:
        """Stop reading (and generating): the client has gone, or the relay ended."""
        ...


# The ASGI ``receive`` of the client's request: a provider that works for a long time before
# its answer (the local engine) listens on it to stop when the client hangs up.
ClientGone = Callable[[], Awaitable[Any]]


class Provider(Protocol):
    name: str

    async def post_json(
        self, path: str, body: dict[str, Any], *, client_gone: ClientGone | None = None
    ) -> UpstreamResponse: ...

    async def open_stream(self, path: str, body: dict[str, Any]) -> UpstreamStream: ...

    def unavailable(self) -> Unavailable | None: ...

    def model_note(self) -> str | None:
        """A line ``/v1/models`` shows for the models served here (None: the policy's own
        description), e.g. that a local checkpoint has random weights."""
        ...

    async def close(self) -> None: ...
