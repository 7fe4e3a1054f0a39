"""Replies already on the socket, read without waiting a loop turn for them.

A write to a Redis that shares the gateway's core (``make run``'s embedded one, on a small
machine) wakes Redis, and the kernel usually runs it before the write returns: its reply is in
the socket by then. Waiting for it through the event loop costs a poll, the transport's read
callback, the stream's waiter and the reading task's wake-up: two loop turns, each a round of
every other request's work on a busy loop. A read straight from the socket takes it at once.

Whether it pays depends on where Redis runs, so it is measured as it goes, not assumed: after a
stretch of tries that mostly found nothing (Redis on another core or machine), reads go back to
waiting for a long stretch, then try again.

Only plain sockets (TCP or unix) are read this way; TLS bytes need the transport's decryption.
Bytes are taken from the socket only while the stream reader holds none, so they reach the
parser in the order they came.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

# A window of tries; below this many hits in one, the next ``_PAUSE`` reads wait instead.
_WINDOW = 64
_MIN_HITS = 8
_PAUSE = 1024
_READ_SIZE = 65536  # redis-py's own default, should its parser not say


class ReadyReplies:
    """Takes what a connection's socket already holds into its hiredis reader, while that pays."""

    __slots__ = ("_hits", "_paused", "_tries", "hits", "misses")

    def __init__(self) -> None:
        self._tries = 0
        self._hits = 0
        self._paused = 0
        self.hits = 0  # totals, for tests and benchmarks
        self.misses = 0

    def take(self, connection: Any, parser: Any) -> bool:
        """Feed ``parser``'s reader with what ``connection``'s socket holds now; False when it
        held nothing (or this is not the moment to look): wait through the stream then."""
        if self._paused:
            self._paused -= 1
            return False
        stream = parser._stream
        writer = connection._writer
        if type(stream) is not asyncio.StreamReader or writer is None:
            return False  # closed, or a stream this does not know the inside of
        if stream._buffer or stream._eof or stream._exception:
            return False  # bytes the stream holds come first; an ended one reports itself
        transport = writer.transport
        # A closing transport may have let its descriptor go, and the number be reused.
        if transport.is_closing() or transport.get_extra_info("ssl_object") is not None:
            return False
        sock = transport.get_extra_info("socket")
        if sock is None:
            return False
        try:
            data = os.read(sock.fileno(), getattr(parser, "_read_size", _READ_SIZE))
        except BlockingIOError:
            self._count(hit=False)
            return False
        except OSError:
            return False  # the transport sees the same failure and the stream reports it
        if not data:
            return False  # the server closed it: the stream reports that too
        parser._reader.feed(data)
        self._count(hit=True)
        return True

    def _count(self, *, hit: bool) -> None:
        if hit:
            self.hits += 1
            self._hits += 1
        else:
            self.misses += 1
        self._tries += 1
        if self._tries == _WINDOW:
            if self._hits < _MIN_HITS:
                self._paused = _PAUSE
            self._tries = self._hits = 0
