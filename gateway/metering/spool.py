"""A local append-only spool of JSON lines, for usage events that Redis could not take.

Layout under ``directory``::

    active.jsonl      appended to, one fsync'ed line per event
    seg-<ns>.jsonl    frozen segments awaiting replay (oldest first by name)
    rejected.jsonl    lines that could not be parsed on replay, kept for a human
    append.lock       shared by appenders, exclusive while ``active`` is frozen
    replay.lock       one replayer at a time, across processes

Appends and the freeze take ``flock`` on ``append.lock``, so a line is never written into a
file that a replay has already read. Several gateway processes may share one directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from gateway.data_dir import private_dir

ACTIVE = "active.jsonl"
REJECTED = "rejected.jsonl"
SEGMENT_GLOB = "seg-*.jsonl"


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[bool]:
    """Yields False when ``mode`` has LOCK_NB and someone else holds the lock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _count_lines(path: Path) -> int:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    count = data.count(b"\n")
    return count + (1 if data and not data.endswith(b"\n") else 0)


class Segment:
    """One frozen spool file. ``done()`` deletes it once every line was accepted."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[bytes]:
        return [line for line in self.path.read_bytes().split(b"\n") if line.strip()]

    def done(self) -> None:
        self.path.unlink(missing_ok=True)
        _fsync_dir(self.path.parent)


class Spool:
    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        private_dir(self.directory)
        self._append_lock = self.directory / "append.lock"
        self._replay_lock = self.directory / "replay.lock"

    @property
    def active_path(self) -> Path:
        return self.directory / ACTIVE

    @property
    def rejected_path(self) -> Path:
        return self.directory / REJECTED

    def append_sync(self, line: bytes) -> None:
        self.append_many_sync([line])

    def append_many_sync(self, lines: list[bytes]) -> None:
        """Append lines with one write() and one fsync (a whole settle batch costs one sync)."""
        if not lines:
            return
        if any(b"\n" in line for line in lines):
            raise ValueError("a spool line must not contain a newline")
        payload = b"".join(line + b"\n" for line in lines)
        with _flock(self._append_lock, fcntl.LOCK_SH):
            fd = os.open(self.active_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                written = os.write(fd, payload)  # one write() with O_APPEND: no interleaving
                while written < len(payload):  # a short write (disk nearly full): finish it
                    written += os.write(fd, payload[written:])
                os.fsync(fd)
            finally:
                os.close(fd)

    async def append(self, line: bytes) -> None:
        """Durably append one line (fsync'ed before returning), off the event loop."""
        await asyncio.to_thread(self.append_sync, line)

    async def append_many(self, lines: list[bytes]) -> None:
        """Durably append several lines (one fsync), off the event loop."""
        await asyncio.to_thread(self.append_many_sync, lines)

    def reject(self, line: bytes) -> None:
        fd = os.open(self.rejected_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.replace(b"\n", b" ") + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)

    def segments(self) -> list[Segment]:
        return [Segment(path) for path in sorted(self.directory.glob(SEGMENT_GLOB))]

    def depth(self) -> int:
        """Lines waiting for replay: the active file plus frozen segments."""
        paths = [self.active_path, *(segment.path for segment in self.segments())]
        return sum(_count_lines(path) for path in paths)

    def _freeze_active(self) -> None:
        with _flock(self._append_lock, fcntl.LOCK_EX):
            if not self.active_path.exists() or self.active_path.stat().st_size == 0:
                return
            target = self.directory / f"seg-{time.time_ns():020d}-{os.getpid()}.jsonl"
            os.rename(self.active_path, target)
            _fsync_dir(self.directory)

    @contextlib.asynccontextmanager
    async def replaying(self) -> AsyncIterator[list[Segment]]:
        """Freeze the active file and yield all segments, oldest first, to one replayer.

        Another process already replaying gets an empty list rather than waiting.
        """
        with _flock(self._replay_lock, fcntl.LOCK_EX | fcntl.LOCK_NB) as acquired:
            if not acquired:
                yield []
                return
            await asyncio.to_thread(self._freeze_active)
            yield self.segments()
