"""The SSE decoder: events split anywhere across chunks, every line ending, comments, multi-line
data, and a last event without its blank line."""

from __future__ import annotations

import pytest

from gateway.formats.sse import SSEDecoder, SSEEvent, encode_sse

STREAM = (
    b": keep-alive comment\r\n"
    b"event: message_start\r\n"
    b'data: {"a": 1}\r\n'
    b"\r\n"
    b"data: line one\n"
    b"data:line two\n"
    b"id: 7\n"
    b"retry: 100\n"
    b"\n"
    b"event: ping\rdata: {}\r\r"
    b"data: [DONE]"
)
EXPECTED = [
    SSEEvent('{"a": 1}', "message_start"),
    SSEEvent("line one\nline two"),
    SSEEvent("{}", "ping"),
    SSEEvent("[DONE]"),
]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_decoder_is_indifferent_to_chunking(size: int) -> None:
    decoder = SSEDecoder()
    events = []
    for start in range(0, len(STREAM), size):
        events.extend(decoder.feed(STREAM[start : start + size]))
    events.extend(decoder.close())
    assert events == EXPECTED


def test_crlf_split_between_chunks_is_one_line_ending() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n\r") == []
    assert decoder.feed(b"\n") == [SSEEvent("a")]


def test_blank_lines_without_data_dispatch_nothing() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"event: x\n\n\n") == []
    assert decoder.close() == []


def test_encode_round_trips() -> None:
    raw = encode_sse(b'{"type":"ping"}', "ping") + encode_sse(b"[DONE]")
    assert raw == b'event: ping\ndata: {"type":"ping"}\n\ndata: [DONE]\n\n'
    assert SSEDecoder().feed(raw) == [SSEEvent('{"type":"ping"}', "ping"), SSEEvent("[DONE]")]
