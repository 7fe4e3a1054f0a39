"""build_logger: one JSON line per event, secrets blanked, and the bound logger itself."""

from __future__ import annotations

import io

import orjson
import structlog

from gateway.logs import LazyFlushStream, build_logger


def test_a_json_line_per_event_with_level_time_and_fields_and_no_secret() -> None:
    out = io.BytesIO()
    log = build_logger("info", "json", out)
    log.info("request", status=200, api_key="sk-live-secret")
    log.debug("hidden below the level")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    line = orjson.loads(lines[0])
    assert line["event"] == "request" and line["level"] == "info" and line["status"] == 200
    assert line["timestamp"].endswith("Z")
    assert line["api_key"] == "[redacted]"


def test_it_is_the_bound_logger_not_a_proxy_that_builds_one_per_call() -> None:
    log = build_logger("warning", "json", io.BytesIO())
    assert isinstance(log, structlog.BoundLoggerBase)
    bound = log.bind(replica="a")
    assert isinstance(bound, type(log)) and bound is not log


def test_lines_wait_in_the_lazy_stream_until_flushed() -> None:
    class Raw(io.BytesIO):
        flushes = 0

        def flush(self) -> None:
            self.flushes += 1

    raw = Raw()
    sink = LazyFlushStream(raw)
    log = build_logger("info", "json", sink)
    log.info("one")
    log.info("two")
    assert raw.flushes == 0
    sink.flush_now()
    assert raw.flushes == 1 and len(raw.getvalue().splitlines()) == 2
