"""The /v1 front doors: the wire format each one speaks, how its bodies are checked at the
door, and what it asks of a provider.

A door's ``format`` decides the client's side of everything: which checks its body passes,
its error envelope (OpenAI's ``{"error": {...}}`` or Anthropic's ``{"type": "error", ...}``),
and how answers and streams are rendered. A chat door (``translatable``) reaches a provider of
any chat format through ``gateway/formats``; the other doors pass OpenAI bodies through to the
providers that offer the operation. ``path`` is the operation in the door's own API, which is
also where the body goes when the provider speaks the door's format.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.api.v1.validation import (
    validate_chat,
    validate_completion,
    validate_embedding,
    validate_image,
    validate_moderation,
    validate_speech,
)
from gateway.errors import InvalidRequest
from gateway.formats import anthropic_messages, openai_responses
from gateway.formats.errors import FormatError
from gateway.formats.internal import ChatRequest, FormatName
from gateway.formats.translation import ClientSide
from gateway.policy import operations

# A door's check of a parsed JSON body: a 400 for a bad one; the internal request when the
# check parsed it into one anyway (None: parsed later, only if a translation needs it).
Check = Callable[[dict[str, Any]], ChatRequest | None]


@dataclass(frozen=True)
class Door:
    route: str  # the route label of usage records, metrics and access lines
    path: str
    format: FormatName
    check: Check
    # What it asks of the model (policy/operations.py): a model that does not serve it is
    # refused at the door, never sent upstream.
    operation: str = field(kw_only=True)
    translatable: bool = False
    streamable: bool = False
    # False: the upstream charges nothing for it (token counting), so neither does the gateway.
    metered: bool = True
    # True: it generates text, so the model's sampling defaults (policy ``defaults:``) apply.
    samples: bool = False

    @functools.cached_property
    def client_side(self) -> ClientSide:
        """What the translation of its requests needs to know of it."""
        return ClientSide(
            self.format,
            self.path,
            translates=self.translatable,
            samples=self.samples,
            legacy=self.route == "completions",
        )


def _parsed_by(parse: Callable[[dict[str, Any]], ChatRequest]) -> Check:
    """A check by a format's parser: its complaint is the gateway's 400 (field path kept)."""

    def check(body: dict[str, Any]) -> ChatRequest:
        try:
            return parse(body)
        except FormatError as exc:
            raise InvalidRequest(exc.message, param=exc.param, code=exc.code) from None

    return check


CHAT = Door(
    "chat.completions",
    "/chat/completions",
    "openai_chat",
    validate_chat,
    operation=operations.CHAT,
    translatable=True,
    streamable=True,
    samples=True,
)
MESSAGES = Door(
    "messages",
    "/messages",
    "anthropic_messages",
    _parsed_by(anthropic_messages.parse_request),
    operation=operations.CHAT,
    translatable=True,
    streamable=True,
    samples=True,
)
RESPONSES = Door(
    "responses",
    "/responses",
    "openai_responses",
    _parsed_by(openai_responses.parse_request),
    operation=operations.CHAT,
    translatable=True,
    streamable=True,
    samples=True,
)
COUNT_TOKENS = Door(
    "messages.count_tokens",
    "/messages/count_tokens",
    "anthropic_messages",
    _parsed_by(lambda body: anthropic_messages.parse_request({"max_tokens": 1, **body})),
    operation=operations.CHAT,
    metered=False,
)
COMPLETIONS = Door(
    "completions",
    "/completions",
    "openai_chat",
    validate_completion,
    operation=operations.COMPLETIONS,
    streamable=True,
    samples=True,
)
EMBEDDINGS = Door(
    "embeddings",
    "/embeddings",
    "openai_chat",
    validate_embedding,
    operation=operations.EMBEDDINGS,
)
IMAGES = Door(
    "images.generations",
    "/images/generations",
    "openai_chat",
    validate_image,
    operation=operations.IMAGES,
)
MODERATIONS = Door(
    "moderations",
    "/moderations",
    "openai_chat",
    validate_moderation,
    operation=operations.MODERATION,
)
SPEECH = Door(
    "audio.speech",
    "/audio/speech",
    "openai_chat",
    validate_speech,
    operation=operations.SPEECH,
)


def _unchecked(body: dict[str, Any]) -> None:
    """An upload's form fields are read for routing only."""


# Multipart uploads (``uploads.py``): their form fields are read for routing only.
TRANSCRIPTIONS = Door(
    "audio.transcriptions",
    "/audio/transcriptions",
    "openai_chat",
    _unchecked,
    operation=operations.TRANSCRIPTION,
)
TRANSLATIONS = Door(
    "audio.translations",
    "/audio/translations",
    "openai_chat",
    _unchecked,
    operation=operations.TRANSCRIPTION,
)
IMAGE_EDITS = Door(
    "images.edits", "/images/edits", "openai_chat", _unchecked, operation=operations.IMAGES
)
