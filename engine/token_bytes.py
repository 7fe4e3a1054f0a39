"""Each token's bytes, for tokenizers whose decoder is byte-level (GPT-2 style: Qwen, Llama 3,
SmolLM2, the GGUF `gpt2` vocabularies).

Such a decoder maps every token to bytes on its own and the text is those bytes, joined and
read as UTF-8 (invalid or unfinished sequences as U+FFFD). So a detokenizer needs no window
of earlier tokens: one list lookup per token, and a byte buffer only while a character is
split over tokens. `TokenBytes.build` returns None for every other decoder, and for a
byte-level one whose tokens do not decode as the table says (checked on the added tokens and
on sample sequences), so the caller keeps the general `DecodeStream`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizer

REPLACEMENT_CHAR = "\ufffd"
_SAMPLE_SEQUENCES = 64  # random sequences decoded both ways before the table is trusted
_SAMPLE_LENGTH = 24


def _byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte-level alphabet, inverted: the code point of each printable stand-in ->
    the byte it stands for (as a latin-1 character, so `str.translate` then `encode` is one
    pass in C)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    stand_in = {byte: byte for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in stand_in:
            stand_in[byte] = 256 + shifted
            shifted += 1
    return {code: chr(byte) for byte, code in stand_in.items()}


@dataclass(frozen=True)
class TokenBytes:
    """`data[id]`: the bytes token `id` decodes to (special tokens: none, as with
    `skip_special_tokens`); `texts[id]`: those bytes as text when they end on a whole
    character, else None (the detokenizer then buffers)."""

    data: list[bytes]
    texts: list[str | None]

    def decode(self, token_ids: list[int]) -> str:
        """The whole text of `token_ids`, as the tokenizer decodes it."""
        size = len(self.data)
        return b"".join(self.data[t] for t in token_ids if t < size).decode("utf-8", "replace")

    @classmethod
    def build(cls, backend: HFTokenizer) -> TokenBytes | None:
        from tokenizers.decoders import ByteLevel

        if not isinstance(backend.decoder, ByteLevel):
            return None
        alphabet = _byte_level_alphabet()
        outside = dict.fromkeys(alphabet)  # translating with it leaves what is not a stand-in
        size = backend.get_vocab_size(with_added_tokens=True)
        data = []
        for token_id in range(size):
            token = backend.id_to_token(token_id) or ""
            # a token with a character outside the alphabet decodes to its own UTF-8
            outside_alphabet = token.translate(outside)
            data.append(
                token.encode() if outside_alphabet else token.translate(alphabet).encode("latin-1")
            )
        for token_id, added in backend.get_added_tokens_decoder().items():
            if added.special and token_id < size:
                data[token_id] = b""
        table = cls(data, [_whole_text(piece) for piece in data])
        return table if table._agrees_with(backend) else None

    def _agrees_with(self, backend: HFTokenizer) -> bool:
        """Whether the tokenizer decodes its added tokens, and random sequences, as here."""
        samples = [[token_id] for token_id in backend.get_added_tokens_decoder()]
        draw = random.Random(0)
        size = len(self.data)
        samples += [
            [draw.randrange(size) for _ in range(_SAMPLE_LENGTH)] for _ in range(_SAMPLE_SEQUENCES)
        ]
        decoded = backend.decode_batch(samples, skip_special_tokens=True)
        return all(self.decode(ids) == text for ids, text in zip(samples, decoded, strict=True))


def _whole_text(piece: bytes) -> str | None:
    text = piece.decode("utf-8", "replace")
    return None if text.endswith(REPLACEMENT_CHAR) else text
