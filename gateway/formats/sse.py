"""Server-sent events on the wire: incremental decoders and the one-event encoder.

``SSEDecoder`` takes bytes as they arrive, split anywhere, and yields whole events (``event``
name and ``data`` as text, multi-line data joined with newlines, comments and ids ignored),
following the WHATWG event-stream rules for line endings and the optional space after the colon.

``SSEDataReader`` is the relay's: it keeps each event's ``data`` as the upstream's bytes (a
relay that passes them on untouched never decodes them), cuts an event longer than a cap, and
returns all the events one read completed at once, so a burst goes on in one write.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: str
    event: str | None = None


class SSEDecoder:
    def __init__(self) -> None:
        self._buffer = b""
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        self._buffer += chunk
        events: list[SSEEvent] = []
        while True:
            line, found = self._next_line()
            if not found:
                return events
            event = self._line(line)
            if event is not None:
                events.append(event)

    def close(self) -> list[SSEEvent]:
        """Whatever a stream left without its final blank line."""
        lines = [self._buffer.removesuffix(b"\r")] if self._buffer else []
        self._buffer = b""
        events = [self._line(line) for line in [*lines, b""]]
        return [event for event in events if event is not None]

    def _next_line(self) -> tuple[bytes, bool]:
        buffer = self._buffer
        newline, carriage = buffer.find(b"\n"), buffer.find(b"\r")
        if carriage == -1 or (newline != -1 and newline < carriage):
            if newline == -1:
                return b"", False
            self._buffer = buffer[newline + 1 :]
            return buffer[:newline], True
        if carriage + 1 == len(buffer):
            return b"", False  # a lone \r at the end: its \n may come with the next chunk
        skip = 2 if buffer[carriage + 1] == 0x0A else 1
        self._buffer = buffer[carriage + skip :]
        return buffer[:carriage], True

    def _line(self, line: bytes) -> SSEEvent | None:
        if not line:
            if not self._data:
                self._event = None
                return None
            event = SSEEvent("\n".join(self._data), self._event)
            self._event, self._data = None, []
            return event
        if line.startswith(b":"):
            return None
        name, _, value = line.partition(b":")
        text = value.removeprefix(b" ").decode("utf-8", "replace")
        if name == b"data":
            self._data.append(text)
        elif name == b"event":
            self._event = text
        return None


class SSEDataReader:
    """Each event's ``data`` (its ``data:`` lines joined with newlines, each stripped of the
    spaces after the colon), as bytes; lines end at ``\n`` (a ``\r`` before it is dropped);
    event names, comments and ids are skipped. An event (or a line still unfinished) longer
    than ``cap`` bytes sets ``too_large``: the events before it are returned, nothing after."""

    __slots__ = ("_data", "_size", "_tail", "cap", "too_large")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.too_large = False
        self._tail = b""  # a line not yet ended
        self._data: list[bytes] = []  # the data lines of the event being read
        self._size = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data of every event ``chunk`` completed, in order (often none, often many)."""
        if self.too_large:
            return []
        lines = (self._tail + chunk if self._tail else chunk).split(b"\n")
        self._tail = lines.pop()
        events: list[bytes] = []
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if line:
                if line.startswith(b"data:"):
                    self._data.append(line[5:].lstrip(b" "))
                    self._size += len(line)
                    if self._size > self.cap:
                        self.too_large = True
                        return events
            elif self._data:
                events.append(self._data[0] if len(self._data) == 1 else b"\n".join(self._data))
                self._data, self._size = [], 0
        self.too_large = len(self._tail) > self.cap
        return events

    def close(self) -> bytes | None:
        """The data of an event the body ended inside (no blank line after it), if any."""
        if self._tail.startswith(b"data:"):
            self._data.append(self._tail.removesuffix(b"\r")[5:].lstrip(b" "))
        self._tail = b""
        data, self._data, self._size = self._data, [], 0
        return b"\n".join(data) if data else None


def encode_sse(data: bytes, event: str | None = None) -> bytes:
    """One event; ``data`` is one line of JSON (or ``[DONE]``)."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + data + b"\n\n"
