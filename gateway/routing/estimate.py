"""Token estimates from a request body, before any provider has counted: the prompt (about
four characters a token) and the most completion tokens the request may produce.

Every client format is read: Chat Completions (``messages``, ``prompt``, ``input``),
Anthropic Messages (``system``, content blocks with tool inputs and results) and the
Responses API (``instructions``, ``input`` items). Routing ranks candidates by cost and skips
those whose ``context_window`` the prompt cannot fit with them, and the limiter reserves the
worst case with them; the settle replaces both by the provider's own figures when it sends
them.
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
