"""Records a stream as it is relayed, for the cache: one list append per frame, one write at the end.

The relay calls ``add`` with every frame it sends (and with the usage-only frame it holds back
from a client that did not ask for usage, marked ``optional``), then ``finish`` once the stream
ended cleanly with ``[DONE]``. Nothing touches Redis until then. A stream that grows past
``max_entry_bytes`` stops being recorded at once (its frames are dropped, so a long stream
costs no memory) and ``finish`` returns None: it is simply not stored. The running check counts
the frames' bytes only, a lower bound of the entry's size, so it never drops a stream that would
fit; ``ResponseCache.store`` checks the encoded entry exactly. A stream that breaks never
reaches ``finish`` and is not stored either.
"""

from __future__ import annotations

import time

from gateway.cache.entry import CachedUsage, CacheEntry


class StreamRecorder:
    __slots__ = ("_frames", "_limit", "_optional", "_size", "overflowed")

    def __init__(self, max_entry_bytes: int) -> None:
        self._limit = max_entry_bytes
        self._frames: list[bytes] = []
        self._optional: list[int] = []
        self._size = 0
        self.overflowed = False

    def add(self, frame: bytes, *, optional: bool = False) -> None:
        """One SSE frame, exactly as sent (``optional``: the usage-only frame)."""
        if self.overflowed:
            return
        self._size += len(frame)
        if self._size > self._limit:
            self.overflowed = True
            self._frames, self._optional = [], []
            return
        if optional:
            self._optional.append(len(self._frames))
        self._frames.append(frame)

    def finish(
        self,
        *,
        model: str,
        provider: str,
        usage: CachedUsage | None,
        created_ms: int | None = None,
    ) -> CacheEntry | None:
        """The entry to store, or None when the stream outgrew ``max_entry_bytes``."""
        if self.overflowed or not self._frames:
            return None
        entry = CacheEntry(
            mode="sse",
            model=model,
            provider=provider,
            created_ms=time.time_ns() // 1_000_000 if created_ms is None else created_ms,
            body=b"".join(self._frames),
            usage=usage,
            frames=tuple(len(frame) for frame in self._frames),
            optional=tuple(self._optional),
        )
        self._frames, self._optional = [], []
        return entry
