"""What an answer writes in one event-loop turn leaves in one send; nothing waits longer."""

from __future__ import annotations

import asyncio

from gateway.server.joined_writes import JOIN_LIMIT, JoinedWrites

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"


class Recorded:
    """A transport that keeps each send."""

    def __init__(self) -> None:
        self.sends: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.sends.append(bytes(data))

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def joined(sent: Recorded) -> JoinedWrites:
    return JoinedWrites(sent, asyncio.get_running_loop())  # type: ignore[arg-type]


async def test_the_writes_of_one_turn_leave_in_one_send() -> None:
    sent = Recorded()
    writes = joined(sent)
    writes.write(HEAD)
    writes.write(b"hello")
    assert sent.sends == []
    await asyncio.sleep(0)
    assert sent.sends == [HEAD + b"hello"]
    writes.write(b"data: [DONE]\n\n")  # a stream's last event and its end, a turn later
    writes.write(b"0\r\n\r\n")
    await asyncio.sleep(0)
    assert sent.sends == [HEAD + b"hello", b"data: [DONE]\n\n0\r\n\r\n"]


async def test_each_turn_s_writes_leave_at_the_next_turn() -> None:
    sent = Recorded()
    writes = joined(sent)
    writes.write(HEAD)  # a stream's head; its first event comes a turn later
    await asyncio.sleep(0)
    assert sent.sends == [HEAD]
    writes.write(b"data: {}\n\n")
    await asyncio.sleep(0)
    assert sent.sends == [HEAD, b"data: {}\n\n"]


async def test_a_large_write_leaves_at_once_after_what_was_held() -> None:
    sent = Recorded()
    writes = joined(sent)
    body = b"x" * JOIN_LIMIT
    writes.write(HEAD)
    writes.write(body)
    assert sent.sends == [HEAD, body]
    await asyncio.sleep(0)
    assert sent.sends == [HEAD, body]


async def test_small_writes_past_the_limit_leave_at_once() -> None:
    sent = Recorded()
    writes = joined(sent)
    piece = b"y" * (JOIN_LIMIT // 4)
    for _ in range(4):
        writes.write(piece)
    assert sent.sends == [piece * 4]
    writes.write(b"z")
    await asyncio.sleep(0)
    assert sent.sends == [piece * 4, b"z"]


async def test_close_sends_what_is_held_first() -> None:
    sent = Recorded()
    writes = joined(sent)
    writes.write(HEAD)  # a HEAD request's answer on a connection that closes
    writes.close()
    assert sent.sends == [HEAD] and sent.closing
    await asyncio.sleep(0)
    assert sent.sends == [HEAD]


async def test_a_connection_gone_before_the_send_gets_nothing() -> None:
    sent = Recorded()
    writes = joined(sent)
    writes.write(HEAD)
    sent.closing = True  # the client left
    await asyncio.sleep(0)
    assert sent.sends == []


async def test_everything_else_is_the_connection_s() -> None:
    writes = joined(Recorded())
    assert writes.get_extra_info("peername") == "info:peername"
    assert not writes.is_closing()
