"""A stream whose upstream stalls or cuts the connection after its head: the relayed error says
which (504 for a stall past the read timeout, 502 for a broken connection), for SSE and for
Bedrock's event stream alike. The upstream is a raw loopback server that answers every POST
with a chunked stream's head (and a first event), then stalls or breaks mid-chunk."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Literal

import pytest

from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.providers.bedrock import BedrockEventStream
from gateway.providers.http_upstream import HttpUpstream
from gateway.settings import UpstreamSettings

READ_TIMEOUT_S = 0.3
SETTINGS = UpstreamSettings(connect_timeout_s=2, read_timeout_s=READ_TIMEOUT_S, total_timeout_s=10)
SSE = b"text/event-stream"
EVENT_STREAM = b"application/vnd.amazon.eventstream"


class BreakingUpstream:
    """Answers every POST with a chunked head of ``content_type`` and ``first`` as its first
    chunk, then stalls until the test ends (``stall``) or cuts the connection mid-chunk."""

    def __init__(self, how: Literal["stall", "cut"], content_type: bytes, first: bytes) -> None:
        self.how = how
        self.content_type = content_type
        self.first = first
        self.released = asyncio.Event()
        self.served: list[asyncio.StreamWriter] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.served.append(writer)
        head = await reader.readuntil(b"\r\n\r\n")
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                await reader.readexactly(int(value))
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: " + self.content_type + b"\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        if self.first:
            writer.write(b"%x\r\n%s\r\n" % (len(self.first), self.first))
        await writer.drain()
        if self.how == "stall":
            await self.released.wait()
        else:  # a chunk announced at 100 bytes, 7 of them sent, then the connection cut
            writer.write(b"64\r\npartial")
            await writer.drain()
            writer.transport.abort()


Start = Callable[[BreakingUpstream], Awaitable[str]]


@pytest.fixture
async def start_upstream() -> AsyncIterator[Start]:
    """Starts an upstream on a free port and returns its URL; all are stopped after the test."""
    started: list[tuple[BreakingUpstream, asyncio.Server]] = []

    async def start(upstream: BreakingUpstream) -> str:
        server = await asyncio.start_server(upstream._serve, "127.0.0.1", 0)
        started.append((upstream, server))
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/stream"

    yield start
    for upstream, server in started:
        upstream.released.set()
        for writer in upstream.served:
            writer.close()
        server.close()
        await server.wait_closed()


async def _read_all(stream: object) -> list[list[bytes]]:
    batches = []
    async for batch in stream.batches():  # type: ignore[attr-defined]
        batches.append(batch)
    return batches


async def test_an_sse_stream_that_stalls_is_a_timeout_naming_the_provider(
    start_upstream: Start,
) -> None:
    url = await start_upstream(BreakingUpstream("stall", SSE, b'data: {"n":1}\n\n'))
    upstream = HttpUpstream("stalling", SETTINGS)
    try:
        stream = await upstream.open_stream(url, b"{}", {"content-type": "application/json"})
        got: list[list[bytes]] = []
        with pytest.raises(UpstreamTimeout, match="stalling stopped sending mid-stream"):
            async for batch in stream.batches():
                got.append(batch)
    finally:
        await upstream.close()
    assert got == [[b'{"n":1}']]  # what came before the stall was relayed


async def test_an_sse_stream_cut_mid_chunk_is_a_broken_stream(start_upstream: Start) -> None:
    url = await start_upstream(BreakingUpstream("cut", SSE, b'data: {"n":1}\n\n'))
    upstream = HttpUpstream("cutting", SETTINGS)
    try:
        stream = await upstream.open_stream(url, b"{}", {"content-type": "application/json"})
        with pytest.raises(UpstreamError, match="cutting broke the stream") as caught:
            await _read_all(stream)
    finally:
        await upstream.close()
    assert not isinstance(caught.value, UpstreamTimeout)
    assert caught.value.status == 502 and caught.value.kind == "protocol"


@pytest.mark.parametrize(
    ("how", "error", "words"),
    [
        ("stall", UpstreamTimeout, "stopped sending mid-stream"),
        ("cut", UpstreamError, "broke the stream"),
    ],
)
async def test_a_bedrock_event_stream_that_breaks_says_how(
    start_upstream: Start, how: Literal["stall", "cut"], error: type[UpstreamError], words: str
) -> None:
    url = await start_upstream(BreakingUpstream(how, EVENT_STREAM, b""))
    upstream = HttpUpstream("bedrock", SETTINGS)
    try:
        response = await upstream.open_response(url, b"{}", {"content-type": "application/json"})
        with pytest.raises(error, match=f"bedrock {words}") as caught:
            await _read_all(BedrockEventStream(upstream, response))
    finally:
        await upstream.close()
    assert caught.value.status == (504 if how == "stall" else 502)
