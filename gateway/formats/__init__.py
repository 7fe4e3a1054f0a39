"""Wire formats: every client and upstream format translated through one internal shape.

Each format package (``openai_chat``, ``anthropic_messages``, ``openai_responses``) offers the
same functions, described by ``WireFormat`` (``wire.py``): parse a client's request into a
``ChatRequest`` and render one for an upstream; parse an upstream's answer into a
``ChatResponse`` and render one for a client; a ``StreamParser`` and a ``StreamRenderer`` for
SSE; and its error envelope. Formats that only upstreams speak (``gemini``,
``bedrock_converse``) offer the upstream half of that (``UpstreamFormat``, ``upstream.py``):
``upstream_format(name)`` serves every format a provider may speak.
A request goes source -> internal -> target, whatever the pair: no pair has its own code.
When source and target are the same format the gateway relays bodies untouched instead.

This package depends on nothing else in the gateway (no HTTP, routing or providers).
"""

from __future__ import annotations

from types import ModuleType
from typing import cast

from gateway.formats import (
    anthropic_messages,
    bedrock_converse,
    gemini,
    openai_chat,
    openai_responses,
)
from gateway.formats.internal import FormatName
from gateway.formats.upstream import UpstreamFormat
from gateway.formats.wire import WireFormat

FORMAT_NAMES: tuple[FormatName, ...] = ("openai_chat", "anthropic_messages", "openai_responses")
# The formats only upstreams speak.
UPSTREAM_ONLY_FORMATS: tuple[FormatName, ...] = ("gemini", "bedrock_converse")


def wire_format(name: FormatName) -> WireFormat:
    """The package of one format by name."""
    modules: dict[str, ModuleType] = {
        "openai_chat": openai_chat,
        "anthropic_messages": anthropic_messages,
        "openai_responses": openai_responses,
    }
    if name not in modules:
        raise ValueError(f"unknown wire format {name!r}; known: {', '.join(FORMAT_NAMES)}")
    return cast(WireFormat, modules[name])


def upstream_format(name: FormatName) -> UpstreamFormat:
    """The upstream half of any format by name: a client format's package, or one that
    only upstreams speak."""
    if name == "gemini":
        return cast(UpstreamFormat, gemini)
    if name == "bedrock_converse":
        return cast(UpstreamFormat, bedrock_converse)
    return cast(UpstreamFormat, wire_format(name))


__all__ = [
    "FORMAT_NAMES",
    "UPSTREAM_ONLY_FORMATS",
    "UpstreamFormat",
    "WireFormat",
    "upstream_format",
    "wire_format",
]
