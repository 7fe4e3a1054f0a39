"""A free loopback TCP port for a server a test or bench starts (bound, then released: nothing
listens on it until that server does)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
