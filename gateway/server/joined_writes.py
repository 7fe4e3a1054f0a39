"""The writes of one answer within one event-loop turn leave in one send.

uvicorn sends each ASGI message at once: a response's status line and headers when the app
sends ``http.response.start``, its body at the next message, a chunked stream's end (``0``) at
the last. With ``TCP_NODELAY`` each is a segment of its own and a wake-up of the client, for
pieces that were ready together: a whole answer's head and body, a stream's last event and its
end. ``JoinedWrites`` stands between one request's cycle and the connection and holds what the
cycle writes until the loop's next turn, then sends it as one. Nothing waits on anything but the
code already running; past ``JOIN_LIMIT`` bytes held, or for one large write, it sends at once
(a body larger than that gains nothing from joining, and holding it would bypass the
connection's flow control).
"""

from __future__ import annotations

import asyncio
from typing import Any

JOIN_LIMIT = 64 * 1024


class JoinedWrites:
    """Wraps a connection's transport for one request/response cycle."""

    __slots__ = ("_held", "_loop", "_size", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if len(data) >= JOIN_LIMIT:  # no copy of a large body: what is held, then it
            self.flush()
            self._transport.write(data)
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(bytes(data))
        self._size += len(data)
        if self._size >= JOIN_LIMIT:
            self.flush()

    def flush(self) -> None:
        """Send what is held now; a connection gone meanwhile takes nothing (uvicorn writes
        nothing to one either)."""
        held = self._held
        if not held:
            return
        self._held, self._size = [], 0
        if not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        # Everything else (is_closing, get_extra_info, pause/resume...) is the connection's.
        return getattr(self._transport, name)
