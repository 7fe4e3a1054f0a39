"""The operations a model can serve, as the capability names a policy declares them with.

A front door asks for one operation (``chat`` for every chat door, ``embeddings`` for
/v1/embeddings, …). A model's ``capabilities`` mix these operation names with plain tags
(``code``, ``vision``, ``tools``, …). A model that names at least one operation serves only the
operations it names: the gateway refuses the others itself, so a client cannot send a chat
model to a path its provider does not have (an upstream 404 there says nothing about the
model's health). A model that names no operation at all serves every operation, as before
operations were declared (policies written before them keep working).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, get_args

# The operation capability of each front door (api/v1/doors.py, api/v1/uploads.py).
CHAT = "chat"  # /v1/chat/completions, /v1/messages (and count_tokens), /v1/responses
COMPLETIONS = "completions"  # /v1/completions (legacy text completions)
EMBEDDINGS = "embeddings"  # /v1/embeddings
MODERATION = "moderation"  # /v1/moderations
IMAGES = "images"  # /v1/images/generations, /v1/images/edits
SPEECH = "speech"  # /v1/audio/speech (text to speech)
TRANSCRIPTION = "transcription"  # /v1/audio/transcriptions, /v1/audio/translations

Operation = Literal[
    "chat", "completions", "embeddings", "moderation", "images", "speech", "transcription"
]
OPERATIONS: frozenset[str] = frozenset(get_args(Operation))


def declared_operations(capabilities: Iterable[str]) -> frozenset[str]:
    """The operations among a model's capabilities (empty: it serves every operation)."""
    return OPERATIONS.intersection(capabilities)


def serves(capabilities: Iterable[str], operation: str) -> bool:
    """May a model with these capabilities be sent ``operation``?"""
    declared = declared_operations(capabilities)
    return not declared or operation in declared
