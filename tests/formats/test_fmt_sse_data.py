"""The relay's SSE reader: each event's data as the upstream's bytes, all the events one read
completed at once, split anywhere, and a cap on an event's size."""

from __future__ import annotations

import pytest

from gateway.formats.sse import SSEDataReader

STREAM = (
    b": keep-alive comment\r\n"
    b"event: message_start\r\n"
    b'data: {"a": 1}\r\n'
    b"\r\n"
    b"data: line one\n"
    b"data:line two\n"
    b"id: 7\n"
    b"\n"
    b'data: {"b": "caf\xc3\xa9"}\n\n'
    b"data: [DONE]\n\n"
)
EXPECTED = [b'{"a": 1}', b"line one\nline two", b'{"b": "caf\xc3\xa9"}', b"[DONE]"]


def test_one_read_gives_every_event_it_completed() -> None:
    reader = SSEDataReader(cap=1024)
    assert reader.feed(STREAM) == EXPECTED
    assert reader.close() is None


@pytest.mark.parametrize("size", [1, 2, 3, 7, 16])
def test_split_anywhere_gives_the_same_events(size: int) -> None:
    reader = SSEDataReader(cap=1024)
    events = []
    for start in range(0, len(STREAM), size):
        events += reader.feed(STREAM[start : start + size])
    assert events == EXPECTED


def test_an_event_completes_only_at_its_blank_line() -> None:
    reader = SSEDataReader(cap=1024)
    assert reader.feed(b"data: one\n") == []
    assert reader.feed(b"\ndata: two\n\ndata: thr") == [b"one", b"two"]
    assert reader.feed(b"ee\n\n") == [b"three"]


def test_an_event_the_body_ended_inside_is_kept() -> None:
    reader = SSEDataReader(cap=1024)
    assert reader.feed(b"data: a\n\ndata: b\ndata: c") == [b"a"]
    assert reader.close() == b"b\nc"
    assert reader.close() is None


def test_an_unfinished_line_past_the_cap_stops_the_reader() -> None:
    reader = SSEDataReader(cap=64)
    assert reader.feed(b"data: one\n\ndata: " + b"x" * 50) == [b"one"]
    assert not reader.too_large
    assert reader.feed(b"x" * 20) == []
    assert reader.too_large
    assert reader.feed(b"\n\ndata: two\n\n") == []  # nothing after it


def test_an_event_of_many_lines_past_the_cap_stops_the_reader() -> None:
    reader = SSEDataReader(cap=64)
    events = reader.feed(b"data: one\n\n" + b"data: 0123456789abcdef\n" * 5 + b"\n")
    assert events == [b"one"] and reader.too_large


def test_an_event_at_the_cap_passes() -> None:
    line = b"data: " + b"x" * 58  # 64 bytes, the cap
    reader = SSEDataReader(cap=64)
    assert reader.feed(line + b"\n\n") == [b"x" * 58]
    assert not reader.too_large
