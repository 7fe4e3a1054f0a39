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


def build_logger(
    level: str = "info", fmt: str = "json", stream: IO[Any] | None = None
) -> structlog.typing.FilteringBoundLogger:
    """A bound logger writing one line per event to ``stream`` (stdout by default)."""
    stream = stream if stream is not None else sys.stdout
    processors: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        drop_secrets,
    ]
    if fmt == "console":
        processors.append(structlog.dev.ConsoleRenderer(colors=False))
        logger_factory: Any = structlog.PrintLogger(stream)
    else:
        processors.append(structlog.processors.JSONRenderer(serializer=_orjson_dumps))
        logger_factory = structlog.BytesLogger(
            stream.buffer if hasattr(stream, "buffer") else stream
        )
    return structlog.wrap_logger(
        logger_factory,
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
    )
