"""A request's prefix blocks: stable 64-bit chained hashes of its prompt's first blocks.

Requests whose prompts open alike (a shared system prompt, the same few-shot examples, earlier
turns of one conversation) share their leading block hashes: ``hashes[i]`` covers blocks
``0..i``, so two prompts share ``hashes[:n]`` exactly when their first ``n`` blocks are equal.
The picker places a new prefix by the first block's hash on the consistent-hash ring, and finds
where a known one went by the longest run of hashes it remembers.

The prompt is rendered cheaply, not through the model's chat template: each message's role and
text in order (a ``prompt`` string or token ids for completions), read only as far as the
blocks need. Blocks are counted

- in tokens (``block_tokens`` each) when the replica's tokenizer is known (a callable given
  here), so blocks follow the engine's own token stream;
- else in characters (``block_chars`` each).

Only complete blocks are hashed, at most ``blocks`` of them; a prompt shorter than one block is
one block, whole. The model name seeds the chain (different models share no cache). The hash is
BLAKE2b, not Python's ``hash`` (salted per process): every gateway replica computes the same
blocks and so the same ring position for a prompt.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

Tokenizer = Callable[[str], Sequence[int]]
# Text handed to a tokenizer per wanted token: generous (a token is ~4 characters of English).
_CHARS_PER_TOKEN_BOUND = 8
_SEPARATOR = "\x1e"  # between messages: no text a client sends can merge two messages' keys


@dataclass(frozen=True)
class PrefixSettings:
    blocks: int = 8
    block_chars: int = 256
    block_tokens: int = 64

    def __post_init__(self) -> None:
        for name in ("blocks", "block_chars", "block_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"prefix {name} must be >= 1, not {getattr(self, name)}")


def stable_hash(data: bytes) -> int:
    """64 bits of BLAKE2b: the same in every process and on every machine."""
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "big")


def _content_text(content: Any, limit_chars: int) -> str:
    """A message's text, at most ``limit_chars`` of it (a huge message is not copied whole)."""
    if isinstance(content, str):
        return content[:limit_chars]
    if not isinstance(content, list):
        return ""
    parts: list[str] = []  # OpenAI content parts: text counts, other parts by their type
    size = 0
    for part in content:
        if size >= limit_chars:
            break
        if isinstance(part, Mapping):
            text = part.get("text")
            piece = text[:limit_chars] if isinstance(text, str) else f"<{part.get('type')}>"
            parts.append(piece)
            size += len(piece)
    return "".join(parts)[:limit_chars]


def _prompt_text(prompt: Any, limit_chars: int) -> str:
    """A completions ``prompt``: a string, token ids, or a list of either (the first counts)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt[:limit_chars]
    if isinstance(prompt, list):  # token ids: their decimal text keys alike prefixes alike
        text = " ".join(str(token) for token in prompt[:limit_chars])
        return text[:limit_chars]
    return ""


def render_prefix(body: Mapping[str, Any], limit_chars: int) -> str:
    """The first ``limit_chars`` characters of the rendered prompt (fewer when it is shorter)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return _prompt_text(body.get("prompt"), limit_chars)
    pieces: list[str] = []
    size = 0
    for message in messages:
        if size >= limit_chars:
            break
        if not isinstance(message, Mapping):
            continue
        text = _content_text(message.get("content"), limit_chars - size)
        piece = f"{message.get('role')}:{text}{_SEPARATOR}"
        pieces.append(piece)
        size += len(piece)
    return "".join(pieces)[:limit_chars]


def _token_bytes(ids: Sequence[int]) -> bytes:
    packed = array("q", ids)
    if sys.byteorder == "big":  # the same bytes on every machine
        packed.byteswap()
    return packed.tobytes()


def _chain(seed: bytes, blocks: list[bytes]) -> tuple[int, ...]:
    hashes = []
    previous = blake2b(seed, digest_size=8).digest()
    for block in blocks:
        previous = blake2b(previous + block, digest_size=8).digest()
        hashes.append(int.from_bytes(previous, "big"))
    return tuple(hashes)


def _complete_blocks(units: Sequence[Any], size: int, limit: int) -> list[Sequence[Any]]:
    """Up to ``limit`` complete blocks of ``size`` units; a shorter whole as one block."""
    count = min(len(units) // size, limit)
    if count == 0:
        return [units]
    return [units[index * size : (index + 1) * size] for index in range(count)]


def prefix_hashes(
    body: Mapping[str, Any], settings: PrefixSettings, tokenizer: Tokenizer | None = None
) -> tuple[int, ...]:
    """The request's chained block hashes (see the module docstring); never empty."""
    model = str(body.get("model", "")).encode()
    if tokenizer is None:
        text = render_prefix(body, settings.blocks * settings.block_chars)
        chunks = _complete_blocks(text, settings.block_chars, settings.blocks)
        encoded = [str(chunk).encode("utf-8", errors="surrogatepass") for chunk in chunks]
        return _chain(b"chars\0" + model, encoded)
    wanted = settings.blocks * settings.block_tokens
    text = render_prefix(body, wanted * _CHARS_PER_TOKEN_BOUND)
    ids = list(tokenizer(text))[:wanted]
    chunks = _complete_blocks(ids, settings.block_tokens, settings.blocks)
    return _chain(b"tokens\0" + model, [_token_bytes(chunk) for chunk in chunks])
