"""One try of a /v1 request at one candidate: the objects the dispatcher calls, once a try.

``Upstreams`` holds what every try of one request shares: the providers (``ProviderRegistry``)
of the policy the request was routed by, the client's headers that may go on
(``forwarding.py``) and the request's trace, in which each try is a span of its own. An attempt
turns a candidate into a call to its provider, in the format the provider speaks:

- ``JsonAttempt`` and ``StreamAttempt``: the request in the provider's format
  (``formats.Translation``: untouched when it speaks the client's, translated otherwise); a
  provider that takes chat requests parsed (``ParsedChatProvider``: the local engine) gets the
  internal request itself;
- ``ForwardAttempt``: bytes passed through (speech, uploads) to providers that speak the
  door's format.

What goes wrong is an ``UpstreamError`` the dispatcher knows what to do with: an operation the
provider does not offer (kind ``unsupported``) or a request its format cannot carry (kind
``untranslatable``) moves on to the next candidate, as does an answer that breaks its own
format (kind ``protocol``, a 502); a body the client's own format refuses is the client's
error (kind ``status``, a 400: no other candidate is tried).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import orjson

from gateway.errors import UpstreamError
from gateway.formats.errors import FormatError, Untranslatable
from gateway.formats.internal import ChatRequest, FormatName, Usage
from gateway.formats.openai_chat.relay import chat_usage
from gateway.formats.translation import Translation
from gateway.policy import Candidate, Policy, ProviderConfig
from gateway.providers.base import (
    ClientGone,
    ParsedChatProvider,
    Provider,
    RawReply,
    UpstreamResponse,
    UpstreamStream,
    broken_answer,
    refused_request,
    unsupported,
)
from gateway.providers.forwarding import forwarded_headers
from gateway.providers.registry import ProviderRegistry
from gateway.server.exchange import CLIENT_GONE
from gateway.tracing import AttemptTrace, RequestTrace

JSON = "application/json"


@dataclass(frozen=True)
class Answer:
    """A whole answer ready for the client, and the usage it reports (None: estimate)."""

    body: bytes
    usage: Usage | None
    media_type: str = JSON
    route_note: str | None = None  # which replica of a fleet served, and why


@dataclass(frozen=True)
class OpenedStream:
    """A provider's stream that answered: its events in ``target``'s format, the provider (its
    ``stream_error``) and the try's span, which ends with the stream."""

    events: UpstreamStream
    target: FormatName
    provider: Provider
    tried: AttemptTrace

    @property
    def route_note(self) -> str | None:
        return self.events.route_note


@dataclass(frozen=True)
class Upstream:
    """A candidate's provider and what every call to it carries (the forwarded headers)."""

    config: ProviderConfig
    provider: Provider
    headers: dict[str, str]


@dataclass
class Upstreams:
    """The providers one request may be sent to (those of the ``policy`` it was routed by),
    the client's headers that may go on, and its tries so far."""

    providers: ProviderRegistry
    policy: Policy
    client_headers: Mapping[str, str]
    request_id: str
    trace: RequestTrace
    tries: int = field(default=0, init=False)

    def of(self, candidate: Candidate) -> Upstream:
        config = self.policy.providers[candidate.provider]
        provider = self.providers.get(candidate.provider, config)
        headers = forwarded_headers(self.client_headers, config.forward_headers, self.request_id)
        return Upstream(config, provider, headers)

    def sampling_defaults(self, candidate: Candidate) -> dict[str, Any] | None:
        """The model's ``defaults:`` of the policy (None: it has none)."""
        return sampling_defaults(self.policy, candidate.model)

    def traced(self, upstream: Upstream, candidate: Candidate) -> AttemptTrace:
        """This try's span (retries and fallbacks each get one); its ``traceparent`` goes
        upstream in place of the client's."""
        self.tries += 1
        tried = self.trace.attempt(
            number=self.tries,
            provider=candidate.provider,
            model=candidate.model,
            upstream_model=candidate.upstream_model,
            local=upstream.config.kind == "local",
        )
        tried.inject(upstream.headers)
        return tried


def sampling_defaults(policy: Policy, model: str) -> dict[str, Any] | None:
    """``model``'s ``defaults:`` of ``policy`` (None: it has none), as its requests get them."""
    config = policy.models.get(model)
    if config is None or config.defaults is None:
        return None
    return config.defaults.model_dump()


def end_try(tried: AttemptTrace, error: BaseException) -> None:
    """A try that raised: its status and kind (never the message: it may quote upstream)."""
    if isinstance(error, UpstreamError):
        tried.end("failed", status=error.status, error_type=error.kind)
    else:
        tried.end("failed", error_type=type(error).__name__)


def end_stream_try(tried: AttemptTrace, status: int) -> None:
    """The served try of a stream ends with the stream (cut, or the client gone)."""
    if status == 200:
        tried.end("ok", status=200)
    else:
        tried.end("cancelled" if status == CLIENT_GONE else "failed", status=status)


@dataclass
class _ChatCall:
    """How a JSON or stream try sends the request: parsed to a provider that takes it so,
    else as a body in the format the provider speaks."""

    upstreams: Upstreams
    translation: Translation

    stream: ClassVar[bool]

    def target(self, candidate: Candidate, upstream: Upstream) -> FormatName:
        provider = upstream.provider
        target = self.translation.target(provider.formats, provider.door_paths)
        if target is None:
            client = self.translation.client
            raise unsupported(candidate.provider, client.path, f"it does not speak {client.format}")
        return target

    def parsed(self, candidate: Candidate, target: FormatName) -> ChatRequest:
        """The internal request for a provider that takes it parsed."""
        defaults = self.upstreams.sampling_defaults(candidate)
        try:
            return self.translation.parsed(
                target, candidate.upstream_model, stream=self.stream, defaults=defaults
            )
        except FormatError as exc:
            raise _refused(exc, candidate.provider) from None

    def body(
        self, candidate: Candidate, upstream: Upstream, target: FormatName
    ) -> tuple[str, dict[str, Any]]:
        """The path and body for a provider speaking ``target``."""
        try:
            return self.translation.upstream_body(
                target,
                candidate.upstream_model,
                stream=self.stream,
                default_max_tokens=upstream.config.default_max_tokens,
                defaults=self.upstreams.sampling_defaults(candidate),
            )
        except FormatError as exc:
            raise _refused(exc, candidate.provider) from None


def _refused(exc: FormatError, provider: str) -> UpstreamError:
    kind = "untranslatable" if isinstance(exc, Untranslatable) else "status"
    return refused_request(exc, provider, kind)


def _parsed_taker(upstream: Upstream, translation: Translation) -> ParsedChatProvider | None:
    """The provider, when it takes this (chat) request parsed."""
    provider = upstream.provider
    # hasattr first: isinstance against a runtime-checkable protocol inspects the class on
    # every call, and most providers (HTTP ones) have no post_chat at all.
    if (
        translation.client.translates
        and hasattr(provider, "post_chat")
        and isinstance(provider, ParsedChatProvider)
    ):
        return provider
    return None


@dataclass
class JsonAttempt(_ChatCall):
    """A try whose answer comes whole: the client's answer from the provider's."""

    # A provider that works long before answering (the local engine) stops when the client
    # hangs up.
    client_gone: ClientGone
    stream: ClassVar[bool] = False

    async def __call__(self, candidate: Candidate) -> Answer:
        upstream = self.upstreams.of(candidate)
        target = self.target(candidate, upstream)
        parsed_taker = _parsed_taker(upstream, self.translation)
        if parsed_taker is not None:
            request = self.parsed(candidate, target)
            tried = self.upstreams.traced(upstream, candidate)
            send = parsed_taker.post_chat(request, client_gone=self.client_gone)
        else:
            path, body = self.body(candidate, upstream, target)
            tried = self.upstreams.traced(upstream, candidate)
            send = upstream.provider.post_json(
                path, body, headers=upstream.headers, client_gone=self.client_gone
            )
        try:
            reply = await send
            if reply.phases is not None:
                tried.engine_phases(reply.phases)
            answer = self._answer(target, reply, candidate.provider)
        except BaseException as exc:
            end_try(tried, exc)
            raise
        tried.end("ok", status=reply.status)
        return answer

    def _answer(self, target: FormatName, reply: UpstreamResponse, provider: str) -> Answer:
        try:
            body, usage = self.translation.answer(target, reply.body, reply.data)
        except FormatError as exc:
            raise broken_answer(exc, provider) from None
        return Answer(body, usage, route_note=reply.route_note)


@dataclass
class StreamAttempt(_ChatCall):
    """A try whose answer streams: served once the provider's stream is open."""

    stream: ClassVar[bool] = True

    async def __call__(self, candidate: Candidate) -> OpenedStream:
        upstream = self.upstreams.of(candidate)
        target = self.target(candidate, upstream)
        parsed_taker = _parsed_taker(upstream, self.translation)
        if parsed_taker is not None:
            request = self.parsed(candidate, target)
            tried = self.upstreams.traced(upstream, candidate)
            opening = parsed_taker.open_chat_stream(request)
        else:
            path, body = self.body(candidate, upstream, target)
            tried = self.upstreams.traced(upstream, candidate)
            opening = upstream.provider.open_stream(path, body, headers=upstream.headers)
        try:
            events = await opening
        except BaseException as exc:
            end_try(tried, exc)
            raise
        return OpenedStream(events, target, upstream.provider, tried)


class Payload(Protocol):
    """What a forwarded call sends for ``model``: ``started`` once some of it went out (a body
    that can be read once cannot be sent again), ``too_large`` once it ran past ``cap``."""

    started: bool
    too_large: bool
    cap: int

    def body(self, model: str) -> bytes | AsyncIterable[bytes]: ...

    def length(self, model: str) -> int | None: ...


@dataclass
class JsonPayload:
    """A JSON body sent with the candidate's model in it, as often as asked (read whole
    already: never too large)."""

    raw: dict[str, Any]
    started: ClassVar[bool] = False
    too_large: ClassVar[bool] = False
    cap: ClassVar[int] = 0

    def body(self, model: str) -> bytes:
        return orjson.dumps({**self.raw, "model": model})

    def length(self, model: str) -> int | None:
        return len(self.body(model))


@dataclass
class ForwardAttempt:
    """A try that passes bytes through (speech, uploads): only to a provider of the door's
    format, and an upload that went (partly) to one is never sent to another."""

    upstreams: Upstreams
    path: str
    client_format: FormatName
    content_type: str
    payload: Payload

    async def __call__(self, candidate: Candidate) -> Answer:
        upstream = self.upstreams.of(candidate)
        if self.client_format not in upstream.provider.formats:
            why = f"it does not speak {self.client_format}"
            raise unsupported(candidate.provider, self.path, why)
        payload, model = self.payload, candidate.upstream_model
        if payload.started:
            raise UpstreamError(
                "the upload was already sent to another provider and cannot be sent again",
                status=502,
                retryable=False,
                kind="spent",
                provider=candidate.provider,
                final=True,
            )
        try:
            reply = await upstream.provider.forward(
                self.path,
                payload.body(model),
                model=model,
                content_type=self.content_type,
                content_length=payload.length(model),
                headers=upstream.headers,
            )
        except Exception as exc:
            if payload.too_large:  # however the HTTP client reported the body's refusal
                raise UpstreamError(
                    f"the upload is larger than the limit of {payload.cap} bytes",
                    status=413,
                    retryable=False,
                    kind="status",
                    code="request_too_large",
                    error_type="invalid_request_error",
                    final=True,
                ) from None
            if isinstance(exc, UpstreamError) and payload.started:
                exc.retryable, exc.final = False, True  # the file went (partly) to this one
            raise
        return forwarded_answer(reply)


def forwarded_answer(reply: RawReply) -> Answer:
    """The provider's bytes as they came, and the usage they report (JSON answers only)."""
    usage: Usage | None = None
    if reply.content_type.lower().startswith(JSON):
        try:
            data = orjson.loads(reply.body)
        except orjson.JSONDecodeError:
            data = None
        found = data.get("usage") if isinstance(data, dict) else None
        if isinstance(found, dict):
            usage = chat_usage(found)
    return Answer(reply.body, usage, reply.content_type, reply.route_note)
