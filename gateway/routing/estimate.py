"""Token estimates from a request body, before any provider has counted: the prompt, typical
(about four characters a token) and bounded (at most what any provider may bill), and the most
completion tokens the request may produce.

Every client format is read: Chat Completions (``messages``, ``prompt``, ``input``),
Anthropic Messages (``system``, content blocks with tool inputs and results) and the
Responses API (``instructions``, ``input`` items). Routing ranks candidates by cost and skips
those whose ``context_window`` the prompt cannot fit with the *typical* figure (a bound would
skip candidates the prompt fits); the limiter reserves the *bound*, so that no request can
spend past a limit (docs/limits.md). The settle replaces both by the provider's own figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

PROMPT_SIDE_FIELDS = ("tools", "functions", "response_format", "tool_choice", "output_config")
# Message fields that are not prompt text the model reads (content is measured on its own).
_MESSAGE_FRAMING_FIELDS = frozenset({"role", "content"})
MESSAGE_FRAMING_CHARS = 16  # role and the chat template's separators


def estimate_prompt_tokens(body: Mapping[str, Any]) -> int:
    """About 4 characters a token, over everything the model reads as prompt.

    Message text (``content`` strings and text parts) plus ``MESSAGE_FRAMING_CHARS`` a message;
    every other message field (``name``, ``tool_calls``, ``tool_call_id``...) and the
    ``PROMPT_SIDE_FIELDS`` of the request count by the length of their JSON; ``prompt`` and
    ``input`` by their text (a token id in an array counts one token). Used to rank candidates
    by cost and for the limiter's reservation; the settle replaces it by the provider's figure.
    """
    chars = 0
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                chars += _text_length(message.get("content")) + MESSAGE_FRAMING_CHARS
                if len(message) > 2 or "content" not in message:  # more than role + content
                    for name, value in message.items():
                        if name not in _MESSAGE_FRAMING_FIELDS and value is not None:
                            chars += _json_length(value)
    for key in ("prompt", "input", "system", "instructions"):
        chars += _text_length(body.get(key))
    for key in PROMPT_SIDE_FIELDS:
        value = body.get(key)
        if value is not None:
            chars += _json_length(value)
    return max(1, chars // 4)


# What a chat template or a provider adds of its own, in tokens: per message (role header,
# separators, end of turn), once per request (begin of text, reply priming, a default system
# prompt some templates insert) and once when tools are declared (the system prompt providers
# wrap tool definitions in: Anthropic documents about 350 tokens).
MESSAGE_FRAMING_TOKENS = 16
REQUEST_FRAMING_TOKENS = 64
TOOLS_FRAMING_TOKENS = 512
# An image part: providers resize images and bill them by size, not by payload bytes; the
# largest per-image figures they publish (OpenAI's patch-priced models, about 3,800 tokens at
# their cap; Anthropic about 1,600) stay below this.
IMAGE_PART_TOKENS = 4096
_IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})
_TOOL_FIELDS = ("tools", "functions")


def prompt_token_bound(body: Mapping[str, Any]) -> int:
    """At least as many tokens as any provider may bill for the request's prompt.

    Byte-level BPE tokenizers (OpenAI's, Llama 3's, Qwen's, the local engine's) and
    SentencePiece with byte fallback never produce more tokens than the UTF-8 bytes of the
    text, so every prompt field counts its UTF-8 bytes (its JSON's, for structured fields:
    keys and punctuation make that an over-count), a token id one token, and the framing
    allowances above are added. An image part counts ``IMAGE_PART_TOKENS`` instead of its
    payload; other media (audio, files) count their payload's bytes. Used for the limiter's
    reservation only: the settle replaces it by what the provider billed.
    """
    tokens = REQUEST_FRAMING_TOKENS
    messages = body.get("messages")
    if isinstance(messages, list):
        tokens += len(messages) * MESSAGE_FRAMING_TOKENS + _bytes_bound(messages)
    for key in ("prompt", "input", "system", "instructions"):
        value = body.get(key)
        if value is None:
            continue
        ids = _token_ids(value)
        if ids is not None:
            tokens += ids
            continue
        tokens += _bytes_bound(value)
        if isinstance(value, list):  # input items or system blocks: each framed like a message
            tokens += len(value) * MESSAGE_FRAMING_TOKENS
    if any(body.get(key) for key in _TOOL_FIELDS):
        tokens += TOOLS_FRAMING_TOKENS
    for key in PROMPT_SIDE_FIELDS:
        value = body.get(key)
        if value is not None:
            tokens += _json_length(value)
    return tokens


def _token_ids(value: Any) -> int | None:
    """How many token ids a ``prompt`` / ``input`` given as ids (or a batch of id lists) holds;
    None when it is text."""
    if not isinstance(value, list) or not value:
        return None
    if all(type(item) is int for item in value):
        return len(value)
    if all(isinstance(item, list) and all(type(i) is int for i in item) for item in value):
        return sum(len(item) for item in value)
    return None


def _bytes_bound(value: Any) -> int:
    """UTF-8 bytes of a JSON value as text (its strings, keys and numbers), with image parts
    at their allowance."""
    # Plain loops, not sum() over generators: every limited request walks its messages here,
    # and a generator per list and per dict was a quarter to a third of the walk
    # (bench.request_pieces).
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, list):
        total = 0
        for item in value:
            total += _bytes_bound(item)
        return total
    if isinstance(value, dict):
        if value.get("type") in _IMAGE_PARTS:
            return IMAGE_PART_TOKENS
        total = 0
        for key, item in value.items():
            total += _bytes_bound(key) + _bytes_bound(item)
        return total
    if value is None or isinstance(value, bool):
        return 5  # null, true, false
    return len(str(value))


def _text_length(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_length(part) for part in value)
    if isinstance(value, dict):
        # A content block or input item: its text, nested content (tool results, message
        # items), a tool call's input or arguments, a function call's output.
        length = _text_length(value.get("text")) + _text_length(value.get("content"))
        length += _text_length(value.get("output"))
        for key in ("input", "arguments"):
            if value.get(key) is not None:
                length += _json_length(value[key])
        return length
    if isinstance(value, int) and not isinstance(value, bool):
        return 4  # a token id (prompt or input given as token arrays)
    return 0


def _json_length(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    try:
        return len(orjson.dumps(value))
    except (TypeError, orjson.JSONEncodeError):
        return 0


def expected_output_tokens(body: Mapping[str, Any], default: int) -> int:
    """Completion tokens one request may produce: ``max_completion_tokens`` (else
    ``max_tokens`` or ``max_output_tokens``, else ``default``) for each of its
    ``max(n, best_of)`` choices."""
    per_choice = default
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = body.get(key)
        if type(value) is int and value > 0:  # not a bool
            per_choice = value
            break
    choices = 1
    for key in ("n", "best_of"):
        value = body.get(key)
        if type(value) is int and value > choices:
            choices = value
    return per_choice * choices
