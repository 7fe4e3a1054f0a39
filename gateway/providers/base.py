"""What every provider is to the rest of the gateway: the ``Provider`` protocol and the values
it trades in. Implementations live beside it (``http_provider.py``, ``local_host.py``); this
file holds only the interface, so the request path and the dispatcher never ask which kind of
provider they hold.

A provider speaks one or more chat wire formats natively (``formats``, preferred first: the
gateway translates a request into the first one when the client's format is not among them).
``path`` is the operation in the provider's own API, OpenAI-style (``/chat/completions``,
``/messages``, ``/responses``, ``/embeddings``, ``/audio/speech``); the provider turns it into
its URL. It answers a JSON request (``post_json`` → ``UpstreamResponse``), opens a stream
(``open_stream`` → ``UpstreamStream``: raw SSE ``data`` payloads, ``[DONE]`` last where the
format has one) or forwards any other body (``forward`` → ``RawReply``: multipart uploads,
audio), raising ``UpstreamError`` for anything that went wrong; an operation it does not offer
is an ``UpstreamError`` with kind ``unsupported`` (the dispatcher moves on). ``headers`` are
the client's headers that may go upstream (already filtered: request id, trace context, the
provider's allow-list); the provider's own headers win over them. ``unavailable()`` says,
before any call, why it cannot take a request now (``None``: it can); ``spill`` marks a
provider that is only busy, which the dispatcher tries again after the other candidates. A
provider that chose among replicas says which one and why in ``route_note`` (on the response
or the stream); the request path appends it to ``x-switchyard-route``.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, Required, TypedDict, Unpack, runtime_checkable

from gateway.errors import UpstreamError
from gateway.formats.errors import ErrorInfo, FormatError
from gateway.formats.internal import ChatRequest
from gateway.tracing.spans import EnginePhases


@dataclass(frozen=True)
class UpstreamResponse:
    status: int
    body: bytes
    data: dict[str, Any]
    route_note: str | None = None  # e.g. "replica=10.0.0.5:8000 (affinity)" (a fleet's pick)
    # The local engine's queue, prefill and decode (for the try's trace span); None elsewhere.
    phases: EnginePhases | None = None


@dataclass(frozen=True)
class RawReply:
    """A forwarded call's answer: its status, body (within the cap) and content type."""

    status: int
    body: bytes
    content_type: str
    route_note: str | None = None  # as ``UpstreamResponse.route_note``


@dataclass(frozen=True)
class Unavailable:
    """Why a provider cannot take a request now; ``spill`` = only because it is busy."""

    detail: str
    spill: bool


class UpstreamStream(Protocol):
    route_note: str | None  # as ``UpstreamResponse.route_note``; None for a single upstream

    def batches(self) -> AsyncIterator[list[bytes]]:
        """Each event's data, ``[DONE]`` included, in non-empty lists of the events that came
        together (relayed in one write); raises ``UpstreamError`` if cut short."""
        ...

    def close(self) -> None:
        """Stop reading (and generating): the client has gone, or the relay ended."""
        ...


@runtime_checkable
class PhasedStream(Protocol):
    """A stream that can say where its time went (the local engine's)."""

    def phases(self) -> EnginePhases: ...


# The ASGI ``receive`` of the client's request: a provider that works for a long time before
# its answer (the local engine) listens on it to stop when the client hangs up.
ClientGone = Callable[[], Awaitable[Any]]


Headers = Mapping[str, str]


class JsonCallOptions(TypedDict, total=False):
    """The keyword arguments of ``post_json``, declared once for the protocol and for the
    providers that pass them on to another provider as they are."""

    headers: Headers | None
    client_gone: ClientGone | None


class ForwardOptions(TypedDict, total=False):
    """The keyword arguments of ``forward``; ``model`` is the upstream model the body names."""

    model: Required[str]
    content_type: Required[str]
    content_length: int | None  # None: the body is sent chunked
    headers: Headers | None


class Provider(Protocol):
    name: str
    formats: tuple[str, ...]  # the chat wire formats it speaks natively, preferred first
    # The operations of doors in another format that it serves from that format's body all
    # the same, translating on its own (Gemini: /embeddings, /messages/count_tokens).
    door_paths: frozenset[str]

    async def post_json(
        self, path: str, body: dict[str, Any], **options: Unpack[JsonCallOptions]
    ) -> UpstreamResponse: ...

    async def open_stream(
        self, path: str, body: dict[str, Any], *, headers: Headers | None = None
    ) -> UpstreamStream: ...

    async def forward(
        self, path: str, body: bytes | AsyncIterable[bytes], **options: Unpack[ForwardOptions]
    ) -> RawReply:
        """Any other body (a multipart upload streamed through)."""
        ...

    def stream_error(self, info: ErrorInfo) -> UpstreamError:
        """An error event the upstream sent mid-stream, as the scrubbed error relayed."""
        ...

    def unavailable(self) -> Unavailable | None: ...

    def model_note(self) -> str | None:
        """A line ``/v1/models`` shows for the models served here (None: the policy's own
        description), e.g. that a local checkpoint has random weights."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class ParsedChatProvider(Protocol):
    """A provider that takes chat requests parsed, in the internal form ``formats/`` read the
    client's body into once, instead of as a body to parse again: the local engine. It answers
    them in its first format."""

    async def post_chat(
        self, request: ChatRequest, *, client_gone: ClientGone | None = None
    ) -> UpstreamResponse: ...

    async def open_chat_stream(self, request: ChatRequest) -> UpstreamStream: ...


def unsupported(provider: str, path: str, why: str = "") -> UpstreamError:
    """The error of an operation a provider does not offer: a 400 for the client when no other
    candidate serves it, but the dispatcher moves on to the next one first."""
    reason = f" ({why})" if why else ""
    return UpstreamError(
        f"provider {provider} does not serve /v1{path}{reason}",
        status=400,
        retryable=False,
        kind="unsupported",
        provider=provider,
        code="unsupported_endpoint",
    )


def local_stream_error(provider: str, info: ErrorInfo) -> UpstreamError:
    """A stream error of an in-process provider (no upstream credentials to scrub)."""
    return UpstreamError(
        f"provider {provider} reported an error mid-stream: {info.message}",
        retryable=False,
        kind="status",
        provider=provider,
        code=info.code,
    )


def refused_request(exc: FormatError, provider: str | None, kind: str) -> UpstreamError:
    """A client's body that cannot go to ``provider`` as a 400 in OpenAI's shape: ``kind``
    ``untranslatable`` (its format cannot carry it: the next candidate may speak the client's)
    or ``status`` (the client's own format refuses it: no other candidate is tried)."""
    return UpstreamError(
        exc.message,
        status=400,
        retryable=False,
        kind=kind,
        provider=provider,
        code=exc.code,
        param=exc.param,
        upstream_body={
            "error": {
                "message": exc.message,
                "type": "invalid_request_error",
                "param": exc.param,
                "code": exc.code,
            }
        },
    )


def broken_answer(exc: FormatError, provider: str) -> UpstreamError:
    """An upstream answer that breaks its own format, or that the client's cannot show: a 502
    (kind ``protocol``: the next candidate is tried)."""
    return UpstreamError(
        f"upstream provider {provider} sent an answer the gateway cannot relay: {exc.message}",
        status=502,
        retryable=False,
        kind="protocol",
        provider=provider,
        code=exc.code,
    )
