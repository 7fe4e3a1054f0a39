"""Reasoning signatures that survive a trip through a client of another format.

A provider's reasoning proof (Anthropic's ``signature``, the Responses API's
``encrypted_content`` with its item id) verifies only at that provider. When a client of
another format receives it, the proof is wrapped as ``switchyard:<origin>:<item id>:<proof>``
in the client format's own signature field; when the client sends the conversation back, the
wrapper is opened, and the proof goes back to its own provider only. A signature without the
wrapper belongs to the client format's own provider.
"""

from __future__ import annotations

from typing import cast

from gateway.formats.internal import FormatName, Thinking

PREFIX = "switchyard:"
_ORIGINS = ("openai_chat", "anthropic_messages", "openai_responses", "gemini", "bedrock_converse")


def for_client(thinking: Thinking, client: FormatName) -> str | None:
    """The signature field a client of ``client`` format gets for this block."""
    if thinking.origin in (None, client) or not (thinking.signature or thinking.item_id):
        return thinking.signature
    return f"{PREFIX}{thinking.origin}:{thinking.item_id or ''}:{thinking.signature or ''}"


def from_client(
    text: str, signature: str | None, client: FormatName, item_id: str | None = None, path: str = ""
) -> Thinking:
    """A thinking block a client sent back, with the origin of its proof restored."""
    if signature and signature.startswith(PREFIX):
        origin, _, rest = signature[len(PREFIX) :].partition(":")
        wrapped_id, _, proof = rest.partition(":")
        if origin in _ORIGINS:
            return Thinking(text, proof or None, wrapped_id or None, cast(FormatName, origin), path)
    return Thinking(text, signature, item_id, client, path)
