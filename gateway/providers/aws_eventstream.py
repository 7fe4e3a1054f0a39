"""AWS's binary event stream (``application/vnd.amazon.eventstream``), decoded incrementally.

Bedrock's ConverseStream answers with it. Each message is framed as: total length (4 bytes,
big-endian), headers length (4), a CRC-32 of those 8 bytes, the headers, the payload, and a
CRC-32 of everything before it. A header is a name (1-byte length, UTF-8), a type byte and a
value (strings and byte arrays with a 2-byte length; booleans, integers, timestamps and UUIDs
of fixed size). ``EventStreamDecoder.feed(chunk)`` takes bytes as the network delivers them,
split anywhere, and returns the whole messages they complete; a CRC that does not match, a
length that cannot be, or a message past the cap is an ``EventStreamError`` (the stream is
broken: nothing after it can be trusted).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any

PRELUDE_BYTES = 12  # total length, headers length, prelude CRC
MESSAGE_CRC_BYTES = 4
MIN_MESSAGE_BYTES = PRELUDE_BYTES + MESSAGE_CRC_BYTES
# Value sizes of the fixed-size header types: 2 byte, 3 short, 4 integer, 5 long,
# 8 timestamp (ms), 9 UUID.
_FIXED = {2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}
_INTEGERS = {2: ">b", 3: ">h", 4: ">i", 5: ">q", 8: ">q"}


class EventStreamError(Exception):
    """A frame that breaks the event-stream encoding."""


@dataclass(frozen=True, slots=True)
class EventMessage:
    headers: dict[str, Any]
    payload: bytes


class EventStreamDecoder:
    """Feed bytes as they arrive; each call returns the messages now complete."""

    def __init__(self, max_message_bytes: int = 16 * 1024 * 1024) -> None:
        self._buffer = bytearray()
        self._max = max_message_bytes

    @property
    def pending(self) -> int:
        """Bytes of a message not yet complete (a stream that ends with some was cut)."""
        return len(self._buffer)

    def feed(self, chunk: bytes) -> list[EventMessage]:
        self._buffer += chunk
        messages: list[EventMessage] = []
        while len(self._buffer) >= PRELUDE_BYTES:
            total, headers_length = struct.unpack_from(">II", self._buffer)
            (prelude_crc,) = struct.unpack_from(">I", self._buffer, 8)
            if zlib.crc32(self._buffer[:8]) != prelude_crc:
                raise EventStreamError("event stream prelude CRC mismatch")
            if total < MIN_MESSAGE_BYTES + headers_length:
                raise EventStreamError(f"event stream message length {total} is too short")
            if total > self._max:
                raise EventStreamError(
                    f"event stream message of {total} bytes is past the limit of {self._max}"
                )
            if len(self._buffer) < total:
                break
            frame = bytes(self._buffer[:total])
            del self._buffer[:total]
            (message_crc,) = struct.unpack_from(">I", frame, total - MESSAGE_CRC_BYTES)
            if zlib.crc32(frame[: total - MESSAGE_CRC_BYTES]) != message_crc:
                raise EventStreamError("event stream message CRC mismatch")
            headers_end = PRELUDE_BYTES + headers_length
            headers = _headers(frame[PRELUDE_BYTES:headers_end])
            messages.append(EventMessage(headers, frame[headers_end : total - MESSAGE_CRC_BYTES]))
        return messages


def _headers(data: bytes) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    at = 0
    try:
        while at < len(data):
            name_length = data[at]
            name = data[at + 1 : at + 1 + name_length].decode()
            at += 1 + name_length
            kind = data[at]
            at += 1
            if kind in (0, 1):
                value: Any = kind == 0
            elif kind in (6, 7):
                (length,) = struct.unpack_from(">H", data, at)
                raw = data[at + 2 : at + 2 + length]
                if len(raw) != length:
                    raise EventStreamError("event stream header value is cut short")
                value = raw.decode() if kind == 7 else raw
                at += 2 + length
            elif kind in _FIXED:
                size = _FIXED[kind]
                raw = data[at : at + size]
                if len(raw) != size:
                    raise EventStreamError("event stream header value is cut short")
                value = raw if kind == 9 else struct.unpack(_INTEGERS[kind], raw)[0]
                at += size
            else:
                raise EventStreamError(f"event stream header type {kind} is unknown")
            headers[name] = value
    except (IndexError, struct.error, UnicodeDecodeError):
        raise EventStreamError("event stream headers are malformed") from None
    return headers
