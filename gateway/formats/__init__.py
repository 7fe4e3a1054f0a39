"""Wire formats: every client and upstream format translated through one internal shape.

Each format package (``openai_chat``, ``anthropic_messages``, ``openai_responses``) offers the
same functions, described by ``WireFormat`` (``wire.py``): parse a client's request into a
``ChatRequest`` and render one for an upstream; parse an upstream's answer into a
``ChatResponse`` and render one for a client; a ``StreamParser`` and a ``StreamRenderer`` for
SSE; and its error envelope.
A request goes source -> internal -> target, whatever the pair: no pair has its own code.
When source and target are the same format the gateway relays bodies untouched instead.

This package depends on nothing else in the gateway (no HTTP, routing or providers).
"""

from __future__ import annotations

from types import ModuleType
from typing import cast

from gateway.formats import anthropic_messages, openai_chat, openai_responses
from gateway.formats.internal import FormatName
from gateway.formats.wire import WireFormat

FORMAT_NAMES: tuple[FormatName, ...] = ("openai_chat", "anthropic_messages", "openai_responses")


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


__all__ = ["FORMAT_NAMES", "WireFormat", "wire_format"]
