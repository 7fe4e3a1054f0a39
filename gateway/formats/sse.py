"""Server-sent events on the wire: an incremental decoder and the one-event encoder.

The decoder takes bytes as they arrive, split anywhere, and yields whole events (``event`` name
and ``data``, multi-line data joined with newlines, comments and ids ignored), following the
WHATWG event-stream rules for line endings and the optional space after the colon.
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


def encode_sse(data: bytes, event: str | None = None) -> bytes:
    """One event; ``data`` is one line of JSON (or ``[DONE]``)."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + data + b"\n\n"
