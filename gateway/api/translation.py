"""One /v1 request on its way to each candidate: its body in the provider's format, the answer
back in the client's.

``Exchange.target(formats)`` picks the provider's format: the door's own when the provider
speaks it (then the body passes untouched, only ``model`` replaced), else the provider's
first. A translation goes through the internal shape (``gateway/formats``): the client's body
is parsed once, when a provider first needs it, and rendered for each format asked. No pair
of formats has code of its own here.

What can go wrong becomes an ``UpstreamError`` the dispatcher knows what to do with: a request
the provider's format cannot carry (kind ``untranslatable``, a 400 naming the client's field:
the next candidate may speak the client's format) and an answer that breaks its own format
(kind ``protocol``, a 502: the next candidate is tried) move on; a body the client's own
format refuses is the client's error (kind ``status``, 400: no other candidate is tried).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.api.doors import CHAT_PATHS, Door
from gateway.errors import UpstreamError
from gateway.formats import anthropic_messages, upstream_format, wire_format
from gateway.formats.errors import FormatError, Untranslatable
from gateway.formats.internal import ChatRequest, FormatName
from gateway.formats.openai_chat.relay import ChatRelay
from gateway.formats.relay import StreamRelay, stream_relay, usage_of
from gateway.formats.sampling_defaults import apply_defaults, unset_defaults
from gateway.metering.gate import Usage
from gateway.providers.base import UpstreamResponse, unsupported
from gateway.routing.policy import AUTO_MODEL, ModelDefaults, ProviderConfig


@dataclass(frozen=True)
class Answer:
    """A JSON answer ready for the client, and the usage it reports (None: estimate)."""

    body: bytes
    usage: Usage | None


def _refusal(exc: FormatError, provider: str | None, kind: str) -> UpstreamError:
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
    """An upstream answer that breaks its own format, or that the client's cannot show."""
    return UpstreamError(
        f"upstream provider {provider} sent an answer the gateway cannot relay: {exc.message}",
        status=502,
        retryable=False,
        kind="protocol",
        provider=provider,
        code=exc.code,
    )


class Exchange:
    """The client's side of one request: its door, its body as sent, and (once needed) the
    internal request it parses into."""

    def __init__(self, door: Door, raw: dict[str, Any], parsed: ChatRequest | None) -> None:
        self.door = door
        self.raw = raw
        self._parsed = parsed

    def target(
        self, provider: str, formats: tuple[str, ...], door_paths: frozenset[str] = frozenset()
    ) -> FormatName:
        """The format a provider speaking ``formats`` gets this request in; a door that does
        not translate reaches only providers of its own format, or those that serve its
        operation from its body on their own (``door_paths``: Gemini's embeddings)."""
        door = self.door
        if door.format in formats or door.path in door_paths:
            return door.format
        if not door.translatable:
            raise unsupported(provider, door.path, f"it does not speak {door.format}")
        return formats[0]  # type: ignore[return-value]

    def request(self, provider: str | None = None) -> ChatRequest:
        """The internal request, parsed on first use; a body its own format refuses is the
        client's error."""
        if self._parsed is None:
            raw = self.raw
            if not raw.get("model"):  # task routing: the plan names the model
                raw = {**raw, "model": AUTO_MODEL}
            try:
                self._parsed = wire_format(self.door.format).parse_request(raw)
            except FormatError as exc:
                raise _refusal(exc, provider, "status") from None
        return self._parsed

    def upstream_body(
        self,
        target: FormatName,
        model: str,
        *,
        stream: bool,
        provider: str,
        config: ProviderConfig,
        defaults: ModelDefaults | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """The path and body for a provider speaking ``target``; the model's ``defaults``
        filled in where the client's body sets none."""
        path, body = self._upstream_body(
            target, model, stream=stream, provider=provider, config=config
        )
        if defaults is not None and self.door.samples:
            values = unset_defaults(self.door.format, self.raw, defaults.model_dump())
            body = apply_defaults(target, body, values, legacy=self.door.route == "completions")
        return path, body

    def _upstream_body(
        self,
        target: FormatName,
        model: str,
        *,
        stream: bool,
        provider: str,
        config: ProviderConfig,
    ) -> tuple[str, dict[str, Any]]:
        door = self.door
        if target == door.format:
            body = {**self.raw, "model": model}
            if stream and target == "openai_chat":
                # Upstream always reports usage, so that limits and usage records are exact.
                options = self.raw.get("stream_options") or {}
                body["stream"] = True
                body["stream_options"] = {**options, "include_usage": True}
            if target == "openai_responses":
                body["store"] = False  # stateless: the upstream keeps nothing either
            return door.path, body
        request = self.request(provider)
        try:
            if target == "anthropic_messages":
                default = config.default_max_tokens or anthropic_messages.DEFAULT_MAX_TOKENS
                body = anthropic_messages.render_request(request, model, default_max_tokens=default)
            else:
                body = upstream_format(target).render_request(request, model)
        except Untranslatable as exc:
            raise _refusal(exc, provider, "untranslatable") from None
        except FormatError as exc:
            raise _refusal(exc, provider, "status") from None
        return CHAT_PATHS[target], body

    def answer(self, target: FormatName, upstream: UpstreamResponse, provider: str) -> Answer:
        """The client's answer from a provider's JSON answer in ``target``."""
        client = self.door.format
        if target == client:
            return Answer(upstream.body, Usage.of(usage_of(client, upstream.data)))
        try:
            response = upstream_format(target).parse_response(upstream.data)
            rendered = wire_format(client).render_response(response, self.request(provider))
        except FormatError as exc:
            raise broken_answer(exc, provider) from None
        return Answer(orjson.dumps(rendered), Usage.of(response.usage))

    def relay(self, target: FormatName) -> StreamRelay:
        """What turns a provider's stream in ``target`` into the client's."""
        client = self.door.format
        if target == client == "openai_chat":
            options = self.raw.get("stream_options") or {}
            return ChatRelay(include_usage=options.get("include_usage") is True)
        request = self._parsed if target == client else self.request()
        return stream_relay(client, target, request)
