"""One client request on its way to each candidate: its body in the provider's format, the
answer back in the client's.

``Translation.target(formats)`` picks the format a provider speaking ``formats`` gets the
request in: the client's own when the provider speaks it (then the body passes untouched, only
``model`` replaced), else the provider's first; None when the request cannot go there (only a
chat request translates). A translation goes through the internal shape: the client's body is
parsed once, when a provider first needs it (``request``), and rendered for each format asked.
A provider that takes chat requests parsed (the local engine) gets that internal request
itself (``parsed``). No pair of formats has code of its own here.

What can go wrong is a ``FormatError`` whose meaning depends on where it came from: raised by
``request``, ``upstream_body`` or ``parsed``, the client's body (an ``Untranslatable`` one: the
provider's format cannot carry it); raised by ``answer`` or a relay, the upstream's answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.formats import anthropic_messages, upstream_format, wire_format
from gateway.formats.internal import ChatRequest, FormatName, Usage
from gateway.formats.openai_chat.relay import ChatRelay
from gateway.formats.relay import StreamRelay, stream_relay, usage_of
from gateway.formats.sampling_defaults import apply_defaults, unset_defaults

# Where a chat request goes at a provider that speaks each format.
CHAT_PATHS: dict[FormatName, str] = {
    "openai_chat": "/chat/completions",
    "anthropic_messages": "/messages",
    "openai_responses": "/responses",
    # Formats only upstreams speak: the provider turns the operation into its own URL.
    "gemini": "/generateContent",
    "bedrock_converse": "/converse",
}
# A body without ``model`` (task routing: the plan names the model) parses with this one.
_ROUTED_LATER = "auto"


@dataclass(frozen=True, slots=True)
class ClientSide:
    """What a front door says about its requests: the client's format, the path of the
    operation in the client's API, whether it translates (chat doors), whether the model's
    sampling defaults apply, and whether it is the legacy completions door."""

    format: FormatName
    path: str
    translates: bool = False
    samples: bool = False
    legacy: bool = False


class Translation:
    """The client's side of one request: its door, its body as sent, and (once needed) the
    internal request it parses into."""

    def __init__(self, client: ClientSide, raw: dict[str, Any], parsed: ChatRequest | None) -> None:
        self.client = client
        self.raw = raw
        self._parsed = parsed

    def target(
        self, formats: tuple[str, ...], door_paths: frozenset[str] = frozenset()
    ) -> FormatName | None:
        """The format a provider speaking ``formats`` gets this request in; None: it cannot
        take it (a door that does not translate reaches only providers of its own format, or
        those that serve its operation from its body on their own: ``door_paths``, Gemini's
        embeddings)."""
        client = self.client
        if client.format in formats or client.path in door_paths:
            return client.format
        if not client.translates:
            return None
        return formats[0]  # type: ignore[return-value]

    def request(self) -> ChatRequest:
        """The internal request, parsed on first use."""
        if self._parsed is None:
            raw = self.raw
            if not raw.get("model"):
                raw = {**raw, "model": _ROUTED_LATER}
            self._parsed = wire_format(self.client.format).parse_request(raw)
        return self._parsed

    def parsed(
        self,
        target: FormatName,
        model: str,
        *,
        stream: bool,
        defaults: Mapping[str, Any] | None = None,
    ) -> ChatRequest:
        """The internal request for ``model``, for a provider that takes it parsed and answers
        in ``target`` (what that format cannot carry is refused as a translation refuses it),
        with the model's sampling ``defaults`` where the client's body sets none."""
        request = self.request()
        wire_format(target).check_portable(request)
        values = self._unset_defaults(defaults)
        return dataclasses.replace(request, model=model, stream=stream, **values)

    def upstream_body(
        self,
        target: FormatName,
        model: str,
        *,
        stream: bool,
        default_max_tokens: int | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """The path and body for a provider speaking ``target``; the model's sampling
        ``defaults`` filled in where the client's body sets none. ``default_max_tokens``: what
        an Anthropic body that sets none gets."""
        path, body = self._upstream_body(target, model, stream, default_max_tokens)
        values = self._unset_defaults(defaults)
        return path, apply_defaults(target, body, values, legacy=self.client.legacy)

    def _unset_defaults(self, defaults: Mapping[str, Any] | None) -> dict[str, Any]:
        if defaults is None or not self.client.samples:
            return {}
        return unset_defaults(self.client.format, self.raw, defaults)

    def _upstream_body(
        self, target: FormatName, model: str, stream: bool, default_max_tokens: int | None
    ) -> tuple[str, dict[str, Any]]:
        client = self.client
        if target == client.format:
            body = {**self.raw, "model": model}
            if stream and target == "openai_chat":
                # Upstream always reports usage, so that limits and usage records are exact.
                options = self.raw.get("stream_options") or {}
                body["stream"] = True
                body["stream_options"] = {**options, "include_usage": True}
            if target == "openai_responses":
                body["store"] = False  # stateless: the upstream keeps nothing either
            return client.path, body
        request = self.request()
        if target == "anthropic_messages":
            default = default_max_tokens or anthropic_messages.DEFAULT_MAX_TOKENS
            body = anthropic_messages.render_request(request, model, default_max_tokens=default)
        else:
            body = upstream_format(target).render_request(request, model)
        return CHAT_PATHS[target], body

    def answer(
        self, target: FormatName, body: bytes, data: dict[str, Any]
    ) -> tuple[bytes, Usage | None]:
        """The client's answer, and the usage it reports, from a provider's JSON answer in
        ``target`` (``body`` as sent, ``data`` parsed)."""
        client = self.client.format
        if target == client:
            return body, usage_of(client, data)
        response = upstream_format(target).parse_response(data)
        rendered = wire_format(client).render_response(response, self.request())
        return orjson.dumps(rendered), response.usage

    def relay(self, target: FormatName) -> StreamRelay:
        """What turns a provider's stream in ``target`` into the client's."""
        client = self.client.format
        if target == client == "openai_chat":
            options = self.raw.get("stream_options") or {}
            return ChatRelay(include_usage=options.get("include_usage") is True)
        request = self._parsed if target == client else self.request()
        return stream_relay(client, target, request)
