"""Reading an HTTP answer's body without buffering past a cap, for every upstream call and the
fleet's metrics scrape alike.

``read_capped(response, cap)`` returns the whole (decompressed) body, or raises ``BodyTooLarge``
as soon as it is known to pass ``cap`` bytes (a declared ``Content-Length`` already says so for
an uncompressed body); the response is then closed, since the rest is never read. Callers turn
``BodyTooLarge`` into their own error.
"""

from __future__ import annotations

import aiohttp


class BodyTooLarge(Exception):
    """An answer (or one stream event) went past its cap."""


async def read_capped(response: aiohttp.ClientResponse, cap: int) -> bytes:
    """The body, or ``BodyTooLarge`` (the response closed) once it passes ``cap`` bytes."""
    declared = response.content_length
    if declared is not None and declared > cap and not response.headers.get("Content-Encoding"):
        response.close()
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await response.content.readany()
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > cap:
            response.close()
            raise BodyTooLarge
        chunks.append(chunk)
