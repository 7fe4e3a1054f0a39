"""The life cycle every format's ``StreamParser`` shares, written once.

A parser takes an upstream's SSE ``data`` payloads one by one (``feed``) and the end of the
upstream's stream (``close``). Each payload is one JSON value; one that is not JSON breaks the
upstream's format. Once a parser has finished (the format's own end event, or an error event)
it ignores whatever else arrives; a stream that ends before that was cut short and becomes one
``StreamError``. ``usage`` is the whole stream's usage so far. A format subclasses
``BaseStreamParser`` and reads each decoded payload in ``_event``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import orjson

from gateway.formats.errors import ErrorInfo, UpstreamProtocolError
from gateway.formats.internal import Usage
from gateway.formats.stream import StreamError, StreamEvent


class BaseStreamParser(ABC):
    """Feed each SSE ``data`` payload; ``close()`` when the upstream's stream ends."""

    def __init__(self) -> None:
        self._finished = False
        self.usage: Usage | None = None

    def feed(self, data: bytes | str) -> list[StreamEvent]:
        if self._finished:
            return []
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise UpstreamProtocolError("upstream sent a stream event that is not JSON") from None
        return self._event(payload)

    def close(self) -> list[StreamEvent]:
        if self._finished:
            return []
        self._finished = True
        return [StreamError(ErrorInfo(502, "the upstream stream ended early", "api_error"))]

    @abstractmethod
    def _event(self, payload: Any) -> list[StreamEvent]:
        """The internal events of one decoded payload (any JSON value: check its shape)."""
