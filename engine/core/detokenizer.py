"""Incremental detokenization for one sequence: one cheap call per token, never half a char.

A byte-level tokenizer (most current models) detokenizes from its `TokenBytes` table: a list
lookup per token, bytes buffered only while a character is split over tokens. Every other
tokenizer uses `DecodeStream` over the tokenizer's `tokenizers.Tokenizer` (`Tokenizer.backend`;
Rust keeps the window and the partial UTF-8 bytes, one call per token); with `tokenizers`
older than 0.21, which lacks it, the window decoder in `engine/tokenizer.py` (two decodes
of a short window per token). Those two start from the last few prompt tokens, so the first
token's leading space decodes as in the full text (a byte-level token's text never depends
on what came before it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from engine.token_bytes import REPLACEMENT_CHAR, TokenBytes
from engine.tokenizer import IncrementalDetokenizer, Tokenizer

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizer

CONTEXT_TOKENS = 5  # prompt tokens of left context


class Detokenizer(Protocol):
    def push(self, token_id: int) -> str:
        """Add one token; return the new text it completes (may be empty)."""
        ...


class ByteDetokenizer:
    """Text from each token's bytes; what `DecodeStream` gives on a byte-level tokenizer.

    A piece is emitted once the bytes held so far read as text that does not end in U+FFFD
    (so invalid bytes come out as U+FFFD as soon as a later token completes a character,
    as the full decode shows them). Ids past the vocabulary decode to nothing.
    """

    __slots__ = ("_data", "_held", "_texts")

    def __init__(self, table: TokenBytes) -> None:
        self._data = table.data
        self._texts = table.texts
        self._held = b""

    def push(self, token_id: int) -> str:
        try:
            if not self._held:
                text = self._texts[token_id]
                if text is not None:
                    return text
            held = self._held + self._data[token_id]
        except IndexError:
            return ""
        text = held.decode("utf-8", "replace")
        if text.endswith(REPLACEMENT_CHAR):
            self._held = held
            return ""
        self._held = b""
        return text


class StreamDetokenizer:
    """`tokenizers.decoders.DecodeStream` over the tokenizer's Rust backend."""

    __slots__ = ("_backend", "_step")

    def __init__(self, backend: HFTokenizer, context: list[int]) -> None:
        from tokenizers.decoders import DecodeStream

        self._backend = backend
        self._step = DecodeStream(ids=context, skip_special_tokens=True).step

    def push(self, token_id: int) -> str:
        return self._step(self._backend, token_id) or ""


def _has_decode_stream() -> bool:
    try:
        from tokenizers.decoders import DecodeStream  # noqa: F401
    except ImportError:  # tokenizers < 0.21
        return False
    return True


def make_detokenizer(tokenizer: Tokenizer, prompt_ids: Sequence[int]) -> Detokenizer:
    table = tokenizer.token_bytes
    if table is not None:  # byte-level: a token's text needs no left context
        return ByteDetokenizer(table)
    if not _has_decode_stream():
        return IncrementalDetokenizer(tokenizer, prompt_ids)
    context = list(prompt_ids[-CONTEXT_TOKENS:])
    if REPLACEMENT_CHAR in tokenizer.decode(context):
        context = []  # a prompt that ends inside a character gives no usable context
    return StreamDetokenizer(tokenizer.backend, context)
