"""structlog loggers built per app (no global configuration): JSON lines or console output.

Secrets never reach a log line: callers pass key ids, never keys, and ``drop_secrets`` blanks
any field whose name says it holds one, as a second line of defence.
"""

from __future__ import annotations

import logging
import sys
from typing import IO, Any

import orjson
import structlog

_SECRET_FIELDS = frozenset({"authorization", "api_key", "key", "secret", "admin_key", "pepper"})


def drop_secrets(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    for name in _SECRET_FIELDS.intersection(event):
        event[name] = "[redacted]"
    return event


def _orjson_dumps(event: dict[str, Any], **_: Any) -> bytes:
    return orjson.dumps(event, default=str)


def _processors(fmt: str) -> list[Any]:
    processors: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        drop_secrets,
    ]
    if fmt == "console":
        processors.append(structlog.dev.ConsoleRenderer(colors=False))
    else:
        processors.append(structlog.processors.JSONRenderer(serializer=_orjson_dumps))
    return processors


def configure_process_logging(level: str = "info", fmt: str = "json") -> None:
    """For ``serve`` only: make modules that call ``structlog.get_logger()`` log like the app."""
    structlog.configure(
        processors=_processors(fmt),
        logger_factory=(
            structlog.PrintLoggerFactory() if fmt == "console" else structlog.BytesLoggerFactory()
        ),
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        cache_logger_on_first_use=True,
    )


class LazyFlushStream:
    """Writes into the stream's buffer but flushes only when ``flush_now`` is called.

    structlog flushes after every line; on the hot path that is one write syscall per request.
    The app flushes this a few times a second instead (a crash may lose that fraction).
    """

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def write(self, data: bytes) -> int:
        return self.raw.write(data)

    def flush(self) -> None:
        pass

    def flush_now(self) -> None:
        self.raw.flush()


def build_logger(
    level: str = "info", fmt: str = "json", stream: IO[Any] | None = None
) -> structlog.typing.FilteringBoundLogger:
    """A bound logger writing one line per event to ``stream`` (stdout by default)."""
    stream = stream if stream is not None else sys.stdout
    processors = _processors(fmt)
    if fmt == "console":
        logger_factory: Any = structlog.PrintLogger(stream)
    else:
        logger_factory = structlog.BytesLogger(
            stream.buffer if hasattr(stream, "buffer") else stream
        )
    # The bound logger itself, not structlog.wrap_logger's lazy proxy: the proxy assembles a
    # new bound logger on every call (a fifth of an access line's cost).
    wrapper_class = structlog.make_filtering_bound_logger(logging.getLevelName(level.upper()))
    return wrapper_class(logger_factory, processors=processors, context={})
