"""DirectRedis: hot-path calls outside redis-py's pool keep its semantics: replies, error
replies, one retry on a fresh socket after a restart, no stale reply after a cancel or a
timeout, and replies read by hiredis without redis-py's per-reply ``read_response``."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
import redis.exceptions
from redis.asyncio.connection import AbstractConnection
from redis_helpers import ClientFactory

from gateway.store.direct import DirectRedis
from gateway.store.embedded import EmbeddedRedis


async def test_replies_match_execute_command(clean_redis: str, make_client: ClientFactory) -> None:
    client = make_client(clean_redis)
    direct = DirectRedis(client)
    sha = await client.script_load("return {KEYS[1], ARGV[1], tonumber(ARGV[2]) + 1}")
    via_direct = await direct.call("EVALSHA", sha, 1, "k", "v", 41)
    via_redis_py = await client.execute_command("EVALSHA", sha, 1, "k", "v", 41)
    assert via_direct == via_redis_py == [b"k", b"v", 42]
    with pytest.raises(redis.exceptions.NoScriptError):
        await direct.call("EVALSHA", "0" * 40, 0)
    assert await direct.call("ECHO", "after an error reply") == b"after an error reply"


async def test_batch_puts_error_replies_in_place(
    clean_redis: str, make_client: ClientFactory
) -> None:
    direct = DirectRedis(make_client(clean_redis))
    replies = await direct.batch(
        [("SET", "a", "1"), ("EVALSHA", "0" * 40, 0), ("INCR", "a"), ("GET", "a")]
    )
    assert isinstance(replies[1], redis.exceptions.NoScriptError)
    assert replies[2:] == [2, b"2"]
    assert await direct.batch([]) == []


def exceptions_in(garbage: list[object]) -> list[object]:
    gc.collect()
    return [o for o in garbage if isinstance(o, BaseException)]


async def test_an_error_reply_in_a_batch_leaves_no_cycle(
    clean_redis: str, make_client: ClientFactory, saved_garbage: list[object]
) -> None:
    direct = DirectRedis(make_client(clean_redis))
    await direct.batch([("SET", "a", "text")])  # the connection opened
    gc.collect()
    saved_garbage.clear()
    replies = await direct.batch(
        [("INCR", "a"), ("XREADGROUP", "GROUP", "g", "c", "STREAMS", "s", ">")]
    )
    assert all(isinstance(reply, redis.exceptions.ResponseError) for reply in replies)
    del replies
    assert exceptions_in(saved_garbage) == []


async def test_a_raised_error_reply_leaves_no_cycle(
    clean_redis: str, make_client: ClientFactory, saved_garbage: list[object]
) -> None:
    direct = DirectRedis(make_client(clean_redis))
    await direct.call("SET", "a", "text")  # the connection opened
    gc.collect()
    saved_garbage.clear()
    with pytest.raises(redis.exceptions.ResponseError, match="not an integer"):
        await direct.call("INCR", "a")
    with pytest.raises(redis.exceptions.ResponseError):
        await direct.script(("EVAL", "return redis.call('INCR', 'a')", 0), ("PING",))
    assert exceptions_in(saved_garbage) == []


async def test_replies_are_read_without_redis_pys_read_response(
    clean_redis: str, make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    direct = DirectRedis(make_client(clean_redis))
    await direct.call("PING")  # the socket is open from here on
    reads: list[object] = []
    real = AbstractConnection.read_response

    async def counted(self: AbstractConnection, *args: Any, **kwargs: Any) -> Any:
        reads.append(self)
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(AbstractConnection, "read_response", counted)
    values = [f"value {i}" * 50 for i in range(200)]  # replies spanning several socket reads
    replies = await direct.batch(
        [("SET", "b", "1"), *(("ECHO", value) for value in values), ("INCR", "b")]
    )
    assert replies == [b"OK", *(value.encode() for value in values), 2]
    assert await direct.call("GET", "b") == b"2"
    assert reads == []


async def test_a_timed_out_read_leaves_no_reply_for_the_next(
    clean_redis: str, make_client: ClientFactory
) -> None:
    client = make_client(clean_redis)  # socket_timeout 1 s, one retry
    direct = DirectRedis(client)
    await direct.call("PING")
    with pytest.raises(redis.exceptions.TimeoutError):
        await direct.call("BLPOP", "empty-list", 3)
    await direct.call("LPUSH", "empty-list", "late")  # what a stale BLPOP would have taken
    assert await direct.batch([("ECHO", "mine")]) == [b"mine"]
    assert await direct.call("LRANGE", "empty-list", 0, -1) == [b"late"]


async def test_a_restarted_redis_is_reached_again_on_the_next_call(
    own_redis: EmbeddedRedis, make_client: ClientFactory
) -> None:
    client = make_client(own_redis.url)
    direct = DirectRedis(client)
    assert await direct.call("SET", "survives", "yes")
    await direct.batch([("GET", "survives")])
    await client.execute_command("SAVE")  # on disk now, whatever the AOF fsync policy
    own_redis.kill()
    own_redis.start()
    # The held sockets died with the old server; the one retry on a fresh socket gets through.
    assert await direct.call("GET", "survives") == b"yes"
    own_redis.kill()
    own_redis.start()
    assert await direct.batch([("GET", "survives")]) == [b"yes"]
    own_redis.kill()
    with pytest.raises((redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        await direct.call("GET", "survives")
    own_redis.start()
    assert await direct.call("GET", "survives") == b"yes"


async def test_a_cancelled_call_leaves_no_reply_for_the_next(
    clean_redis: str, make_client: ClientFactory
) -> None:
    direct = DirectRedis(make_client(clean_redis))
    await direct.call("PING")  # one held connection, reused below
    blocked = asyncio.ensure_future(direct.call("BLPOP", "empty-list", 0.3))
    await asyncio.sleep(0.05)
    blocked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await blocked
    await asyncio.sleep(0.4)  # BLPOP's nil reply would now be waiting on that socket
    assert await direct.call("ECHO", "mine") == b"mine"
    assert await direct.batch([("ECHO", "also mine")]) == [b"also mine"]


async def test_a_call_on_an_open_socket_starts_no_task(
    clean_redis: str, make_client: ClientFactory
) -> None:
    """With a socket timeout (the gateway's), redis-py's ``send_packed_command`` runs each
    write in ``asyncio.wait_for``: on Python 3.11 a task and three loop turns a call."""
    direct = DirectRedis(make_client(clean_redis))
    await direct.call("PING")  # the socket is open from here on
    loop = asyncio.get_running_loop()
    started: list[Any] = []
    factory = loop.get_task_factory()

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **options: Any) -> Any:
        started.append(coro)
        return asyncio.Task(coro, loop=loop, **options)

    loop.set_task_factory(counting)
    try:
        assert await direct.call("ECHO", "x") == b"x"
        assert await direct.batch([("ECHO", "y")]) == [b"y"]
        assert await direct.script(("EVAL", "return 1", 0), ("EVAL", "return 1", 0)) == 1
    finally:
        loop.set_task_factory(factory)
    assert started == []
