"""One cached answer and its bytes in Redis.

An entry keeps exactly what the first client was sent, so a hit replays the same bytes:

* ``json``: the response body;
* ``sse``: the stream's frames as they went out (``data: {...}\\n\\n`` ... ``data: [DONE]\\n\\n``),
  concatenated, with each frame's length. The usage-only chunk that upstream always sends (the
  gateway asks for it to settle limits exactly) is kept and marked ``optional``: a replay to a
  client that did not set ``stream_options.include_usage`` drops it, as the live relay does,
  and one that did gets it, whatever the recording client asked. So two clients with the same
  ``include_usage`` get byte-identical streams.

A hit replays the original ``id`` and ``created`` fields too: the answer is the stored one,
as with any HTTP cache (``Age`` says how old it is). Streams and JSON answers of one request
are separate entries (the mode is part of the key): rebuilding a JSON answer from chunks (or
chunks from a JSON answer) would not give the bytes the provider sends, and the rebuild is
where bugs would hide; the price is that one question asked both ways is stored twice.

Wire format (``encode``/``decode``): ``SYC1``, the creation time in ms as 13 ASCII digits
(the lookup script reads it for ``max-age``), the metadata length as 8 ASCII digits, the
metadata (JSON: mode, model, provider, usage, frame lengths, optional frames), the body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.cache.key import Mode

MAGIC = b"SYC1"
_CREATED_DIGITS = 13
_META_DIGITS = 8
_HEADER = len(MAGIC) + _CREATED_DIGITS + _META_DIGITS


class CacheEntryError(ValueError):
    """Stored bytes that are not an entry of this version (read as a miss)."""


@dataclass(frozen=True, slots=True)
class CachedUsage:
    """The usage the provider reported for the stored answer (the hit's usage record)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class CacheEntry:
    mode: Mode
    model: str
    provider: str
    created_ms: int
    body: bytes
    usage: CachedUsage | None = None
    frames: tuple[int, ...] = ()  # sse: each frame's length, in order
    optional: tuple[int, ...] = ()  # sse: positions of the usage-only frames

    def age_s(self, now_ms: int) -> int:
        return max(0, now_ms - self.created_ms) // 1000

    def sse_body(self, include_usage: bool) -> bytes:
        """The stream to send, whole (a hit is replayed at full speed, in one write)."""
        if self.mode != "sse":
            raise ValueError("sse_body of a JSON entry")
        if include_usage or not self.optional:
            return self.body
        skip = set(self.optional)
        view = memoryview(self.body)
        parts: list[memoryview] = []
        offset = 0
        for position, length in enumerate(self.frames):
            if position not in skip:
                parts.append(view[offset : offset + length])
            offset += length
        return b"".join(parts)

    def encode(self) -> bytes:
        meta: dict[str, Any] = {"mode": self.mode, "model": self.model, "provider": self.provider}
        if self.usage is not None:
            meta["usage"] = [
                self.usage.prompt_tokens,
                self.usage.completion_tokens,
                self.usage.cached_tokens,
            ]
        if self.mode == "sse":
            meta["frames"] = self.frames
            meta["optional"] = self.optional
        meta_bytes = orjson.dumps(meta)
        if not 0 <= self.created_ms < 10**_CREATED_DIGITS:
            raise ValueError(f"created_ms out of range: {self.created_ms}")
        if len(meta_bytes) >= 10**_META_DIGITS:
            raise ValueError("entry metadata too large")
        header = b"%s%013d%08d" % (MAGIC, self.created_ms, len(meta_bytes))
        return b"".join((header, meta_bytes, self.body))

    @classmethod
    def decode(cls, data: bytes) -> CacheEntry:
        if data[: len(MAGIC)] != MAGIC:
            raise CacheEntryError("not a cache entry of this version")
        try:
            created_ms = int(data[len(MAGIC) : len(MAGIC) + _CREATED_DIGITS])
            meta_len = int(data[len(MAGIC) + _CREATED_DIGITS : _HEADER])
            meta = orjson.loads(data[_HEADER : _HEADER + meta_len])
            body = data[_HEADER + meta_len :]
            usage = meta.get("usage")
            entry = cls(
                mode=meta["mode"],
                model=meta["model"],
                provider=meta["provider"],
                created_ms=created_ms,
                body=body,
                usage=CachedUsage(*usage) if usage is not None else None,
                frames=tuple(meta.get("frames", ())),
                optional=tuple(meta.get("optional", ())),
            )
        except (ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
            raise CacheEntryError(f"corrupt cache entry: {exc}") from None
        if entry.mode not in ("json", "sse") or sum(entry.frames) != (
            len(body) if entry.mode == "sse" else 0
        ):
            raise CacheEntryError("corrupt cache entry: frame lengths do not match the body")
        return entry
