"""A Chat Completions (or legacy Completions) stream relayed to a client of the same format.

The upstream's chunks go out byte for byte; each is read only for what the gateway meters: the
usage chunk (sent on only when the client asked with ``stream_options.include_usage``: the
gateway always asks upstream for it), the choices that carry output (about one token each, the
estimate when a stream ends before its usage), ``[DONE]``, and an ``{"error": ...}`` event
(not sent: the caller scrubs it and sends its own). Unlike the translating parser, this reads
any number of choices (``n`` > 1) and legacy ``text`` choices.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.formats.errors import ErrorInfo, FormatError
from gateway.formats.internal import Usage
from gateway.formats.openai_errors import parse_error, render_stream_error
from gateway.formats.openai_usage import parse_openai_usage
from gateway.formats.relay_progress import RelayProgress

DONE = b"data: [DONE]\n\n"
# Delta fields that carry generated output.
OUTPUT_DELTA_FIELDS = ("content", "tool_calls", "function_call", "refusal", "reasoning_content")


def chat_usage(usage: dict[str, Any]) -> Usage | None:
    """An OpenAI usage object of any endpoint: ``prompt_tokens`` (chat, completions,
    embeddings) or ``input_tokens`` (images, audio); None when it has neither."""
    try:
        if isinstance(usage.get("prompt_tokens"), int):
            return parse_openai_usage(usage, "prompt", "completion")
        if isinstance(usage.get("input_tokens"), int):
            return parse_openai_usage(usage, "input", "output")
    except FormatError:
        return None
    return None


def produced_pieces(chunk: Any) -> int:
    """Choices in one chunk that carry new output (role-only, finish-only and usage-only
    chunks count 0)."""
    if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
        return 0
    count = 0
    for choice in chunk["choices"]:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if any(delta.get(name) for name in OUTPUT_DELTA_FIELDS):
                count += 1
        elif choice.get("text"):
            count += 1
    return count


class ChatRelay(RelayProgress):
    """Feed each SSE ``data`` payload; the bytes returned go to the client."""

    def __init__(self, include_usage: bool | None) -> None:
        super().__init__()
        self.include_usage = include_usage is True
        # The usage-only chunk last held back from the client (the response cache keeps it).
        self.withheld: bytes | None = None

    def feed(self, data: bytes) -> bytes:
        if self.finished:
            return b""
        if data == b"[DONE]":
            self.finished = True
            return DONE
        try:
            chunk: Any = orjson.loads(data)
        except orjson.JSONDecodeError:
            chunk = None
        if isinstance(chunk, dict):
            if "error" in chunk and "choices" not in chunk:
                self.stop(parse_error(None, chunk))
                return b""
            self.produced += produced_pieces(chunk)
            usage = chunk.get("usage")
            if isinstance(usage, dict):
                self.usage = chat_usage(usage) or self.usage
                if not self.include_usage and not chunk.get("choices"):
                    self.withheld = b"data: " + data + b"\n\n"
                    return b""  # the usage-only chunk the client did not ask for
        return b"data: " + data + b"\n\n"

    def render_error(self, info: ErrorInfo) -> bytes:
        return render_stream_error(info)
