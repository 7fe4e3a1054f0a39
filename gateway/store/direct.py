"""Hot-path Redis calls on connections kept out of redis-py's pool between calls.

Each ``execute_command`` / ``pipeline().execute()`` of redis-py 8 takes the pool's lock, checks
the connection (connect, ``can_read``), records observability counters and wraps the call in a
``Retry``; measured on this box that is ~35 µs of a ~110 µs loopback round trip. ``DirectRedis``
keeps the connections it has used in its own list (a plain pop/append: one event loop, no lock)
and keeps redis-py's semantics where they matter:

- one immediate retry on a connection error or timeout, on a fresh socket (as the gateway's
  ``Retry(NoBackoff(), 1)``);
- a connection that failed or was cancelled mid-call is disconnected before reuse, so no stale
  reply is ever read by the next call; error replies (``NOSCRIPT``, a script error) leave it clean;
- replies are those of ``execute_command`` for commands without a response callback (scripts),
  and those of ``pipeline(transaction=False).execute(raise_on_error=False)`` for a batch;
- a script sent by SHA that comes back NOSCRIPT is sent again as EVAL with its source on the
  same connection, so the run never depends on a SCRIPT LOAD having reached the same server
  (a failover, a restart, two servers taking turns on one socket path).

Commands are written without redis-py's ``send_packed_command`` once the socket is open: with a
``socket_timeout`` set it wraps each write in ``asyncio.wait_for``, which on Python 3.11 runs the
write as a task of its own and wakes the caller through a done callback: three loop turns and a
timer per call, each turn a round of every other request's work on a busy loop. The write goes
straight to the socket here; only a write the socket could not take at once waits (for
``socket_timeout``, as redis-py's would). A connection not yet open, closing, or with health
checks on goes through redis-py's own path.

Commands are packed by hiredis's C ``pack_command`` (the same bytes as redis-py's pure-Python
packer, which took 12 µs for the 27 arguments of a reservation against 2 µs). The hot path's
commands are single words, so redis-py's splitting of ``"CONFIG GET"``-style names is not needed.

Replies are parsed by the connection's own hiredis reader straight from what the socket has,
all of a round trip's under one deadline (``socket_timeout``), instead of one redis-py
``read_response`` each: that sets up and cancels a timeout and runs four calls of its own per
reply, 5-6 µs each, and a settle batch carries one reply per usage event. Errors are redis-py's
(an error reply in place or raised as ``read_response`` would; a read that fails, ends or times
out disconnects and raises ``ConnectionError`` or ``TimeoutError``). A connection parsed
otherwise (no hiredis, health checks) reads through redis-py. A reply already on the socket
when the read starts, as it mostly is with Redis on the gateway's core, is taken from the socket
at once rather than waited for through the event loop (``ReadyReplies``).

The connections stay checked out of the client's pool, so ``client.aclose()`` disconnects them
with the rest. A Redis Cluster client goes through redis-py as before (it routes by slot).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import hiredis
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.store.connect import RedisClient
from gateway.store.ready_replies import ReadyReplies

_RETRYABLE = (RedisConnectionError, RedisTimeoutError)

try:  # redis-py's own hiredis parser, whose reader ``read_replies`` drives
    from redis._parsers.hiredis import NOT_ENOUGH_DATA, _AsyncHiredisParser
except ImportError:  # moved in some redis-py: every reply is read through ``read_response``
    NOT_ENOUGH_DATA = _AsyncHiredisParser = None


def pack(commands: Sequence[tuple[Any, ...]]) -> bytes:
    """The RESP bytes of ``commands``; a value that is not str, bytes, int or float (a bool,
    None) raises ``DataError``, as redis-py's packer does."""
    try:
        return b"".join([hiredis.pack_command(command) for command in commands])
    except TypeError as exc:
        raise DataError(f"cannot send {commands!r}: {exc}") from exc


class DirectRedis:
    """``call`` (one command) and ``batch`` (one pipelined round trip) for the hot path."""

    def __init__(self, client: RedisClient, max_idle: int = 256) -> None:
        self._client = client
        # A single node only; a cluster (or a client pinned to one connection) keeps redis-py.
        direct = isinstance(client, Redis) and not client.single_connection_client
        self._pool = client.connection_pool if direct else None
        self._idle: list[AbstractConnection] = []
        self._max_idle = max_idle
        self.ready = ReadyReplies()

    @property
    def client(self) -> RedisClient:
        return self._client

    async def call(self, *args: Any) -> Any:
        """One command, its reply (error replies raise, as ``execute_command`` does)."""
        if self._pool is None:
            return await self._client.execute_command(*args)
        return await self._run(_Single(args))

    async def script(self, evalsha: tuple[Any, ...], fallback: tuple[Any, ...]) -> Any:
        """``EVALSHA …``; on NOSCRIPT, ``fallback`` (the same run as ``EVAL <source> …``) on the
        same connection. Other error replies raise, as ``call`` does."""
        if self._pool is None:  # a cluster routes both by the script's keys: the same node
            try:
                return await self._client.execute_command(*evalsha)
            except NoScriptError:
                return await self._client.execute_command(*fallback)
        return await self._run(_Script(evalsha, fallback))

    async def batch(
        self,
        commands: Sequence[tuple[Any, ...]],
        fallbacks: Sequence[tuple[Any, ...] | None] | None = None,
    ) -> list[Any]:
        """Commands in one round trip; error replies come back in place, as exceptions. A
        command answered NOSCRIPT is replaced by its ``fallbacks`` entry (an EVAL), sent on the
        same connection in a second round trip."""
        if self._pool is None:
            return await pipelined_batch(self._client, commands, fallbacks)
        return await self._run(_Batch(commands, fallbacks))

    async def _run(self, work: _Single | _Script | _Batch) -> Any:
        assert self._pool is not None
        connection = self._idle.pop() if self._idle else await self._pool.get_connection()
        try:
            try:
                return await work.run(connection, self.ready)
            except _RETRYABLE:
                await connection.disconnect(nowait=True)
                return await work.run(connection, self.ready)  # reconnects on send
        except ResponseError:
            raise  # the reply was read whole: the connection is clean
        except BaseException:
            # Failed or cancelled mid-call: a reply may still be in flight on this socket.
            await connection.disconnect(nowait=True)
            raise
        finally:
            if len(self._idle) < self._max_idle:
                self._idle.append(connection)
            else:
                await self._pool.release(connection)


class _Single:
    __slots__ = ("args",)

    def __init__(self, args: tuple[Any, ...]) -> None:
        self.args = args

    async def run(self, connection: AbstractConnection, ready: ReadyReplies) -> Any:
        await send(connection, pack((self.args,)))
        return _raised(await read_replies(connection, 1, ready))


class _Script:
    __slots__ = ("evalsha", "fallback")

    def __init__(self, evalsha: tuple[Any, ...], fallback: tuple[Any, ...]) -> None:
        self.evalsha = evalsha
        self.fallback = fallback

    async def run(self, connection: AbstractConnection, ready: ReadyReplies) -> Any:
        await send(connection, pack((self.evalsha,)))
        replies = await read_replies(connection, 1, ready)
        if isinstance(replies[0], NoScriptError):  # read whole: ask again on this very connection
            await send(connection, pack((self.fallback,)))
            replies = await read_replies(connection, 1, ready)
        return _raised(replies)


class _Batch:
    __slots__ = ("commands", "fallbacks")

    def __init__(
        self,
        commands: Sequence[tuple[Any, ...]],
        fallbacks: Sequence[tuple[Any, ...] | None] | None,
    ) -> None:
        self.commands = commands
        self.fallbacks = fallbacks

    async def run(self, connection: AbstractConnection, ready: ReadyReplies) -> list[Any]:
        replies = await _exchange(connection, self.commands, ready)
        again = _noscript_retries(replies, self.fallbacks)
        if again:
            for position, reply in zip(
                again, await _exchange(connection, list(again.values()), ready), strict=True
            ):
                replies[position] = reply
        return replies


async def send(connection: AbstractConnection, data: bytes) -> None:
    """``data`` onto the connection's socket, with redis-py's errors: a write that fails or
    times out disconnects it and raises ``ConnectionError`` or ``TimeoutError``."""
    writer = getattr(connection, "_writer", None)
    if writer is None or connection.health_check_interval or writer.transport.is_closing():
        await connection.send_packed_command(data)  # connects, checks or raises as redis-py does
        return
    try:
        writer.write(data)
        if writer.transport.get_write_buffer_size():  # the socket did not take it all at once
            async with asyncio.timeout(connection.socket_timeout):
                await writer.drain()
    except TimeoutError:
        await connection.disconnect(nowait=True)
        raise RedisTimeoutError("Timeout writing to socket") from None
    except OSError as exc:
        await connection.disconnect(nowait=True)
        raise RedisConnectionError(f"Error while writing to socket: {exc}") from exc
    except BaseException:
        await connection.disconnect(nowait=True)
        raise


async def _exchange(
    connection: AbstractConnection, commands: Sequence[tuple[Any, ...]], ready: ReadyReplies
) -> list:
    await send(connection, pack(commands))
    return await read_replies(connection, len(commands), ready)


def _raised(replies: list[Any]) -> Any:
    """The one reply of a call; an error reply raises, as ``execute_command`` does."""
    reply = replies.pop()
    if isinstance(reply, ResponseError):
        try:
            raise reply
        finally:
            del reply  # the traceback holds this frame: no cycle through it
    return reply


async def read_replies(
    connection: AbstractConnection, count: int, ready: ReadyReplies | None = None
) -> list[Any]:
    """The next ``count`` replies on ``connection``, error replies in place as exceptions that
    were never raised (so none holds a frame: a raised one kept here would be a cycle with
    ``replies``, which the exporter meets on every shard after a flush as NOGROUP). With
    ``ready``, replies already on the socket are taken without waiting a loop turn."""
    parser = connection._parser
    reader = getattr(parser, "_reader", None)
    if (
        _AsyncHiredisParser is None
        or type(parser) is not _AsyncHiredisParser
        or not isinstance(reader, hiredis.Reader)
        or connection.health_check_interval
    ):
        return await _read_through_redis_py(connection, count)
    push = getattr(parser, "_hiredis_PushNotificationType", None)
    replies: list[Any] = []
    deadline = None  # one for the whole read, set when it first has to wait
    try:
        while len(replies) < count:
            if not parser._connected:
                raise RedisConnectionError("Connection closed by server.")
            reply = reader.gets()
            if reply is NOT_ENOUGH_DATA:
                if ready is not None and ready.take(connection, parser):
                    continue
                if deadline is None and connection.socket_timeout is not None:
                    deadline = asyncio.get_running_loop().time() + connection.socket_timeout
                async with asyncio.timeout_at(deadline):
                    await parser.read_from_socket()  # ConnectionError at the stream's end
                continue
            if push is not None and isinstance(reply, push):  # RESP3: not a reply
                async with asyncio.timeout_at(deadline):
                    await parser.handle_push_response(reply)
                continue
            if isinstance(reply, RedisConnectionError):  # LOADING and the like
                raise reply
            if isinstance(reply, list) and reply and isinstance(reply[0], RedisConnectionError):
                raise reply[0]  # as redis-py's parser does
            replies.append(reply)
    except TimeoutError:
        await connection.disconnect(nowait=True)
        raise RedisTimeoutError("Timeout reading from the socket") from None
    except OSError as exc:
        await connection.disconnect(nowait=True)
        raise RedisConnectionError(f"Error while reading from the socket: {exc}") from exc
    except BaseException:
        await connection.disconnect(nowait=True)
        raise
    return replies


async def _read_through_redis_py(connection: AbstractConnection, count: int) -> list[Any]:
    replies: list[Any] = []
    for _ in range(count):
        try:
            replies.append(await connection.read_response())
        except ResponseError as error:
            replies.append(error.with_traceback(None))  # its frame holds ``replies``: a cycle
    return replies


def _noscript_retries(
    replies: list[Any], fallbacks: Sequence[tuple[Any, ...] | None] | None
) -> dict[int, tuple[Any, ...]]:
    """Reply position → the fallback to send for each command answered NOSCRIPT."""
    if not fallbacks:
        return {}
    return {
        position: fallback
        for position, (reply, fallback) in enumerate(zip(replies, fallbacks, strict=True))
        if fallback is not None and isinstance(reply, NoScriptError)
    }


async def pipelined_batch(
    client: RedisClient,
    commands: Sequence[tuple[Any, ...]],
    fallbacks: Sequence[tuple[Any, ...] | None] | None = None,
) -> list[Any]:
    """``DirectRedis.batch`` through redis-py's pipeline (a cluster routes each command by its
    keys, so a fallback goes to the node that answered NOSCRIPT)."""
    replies = await _pipelined(client, commands)
    again = _noscript_retries(replies, fallbacks)
    if again:
        retried = await _pipelined(client, list(again.values()))
        for position, reply in zip(again, retried, strict=True):
            replies[position] = reply
    return replies


async def _pipelined(client: RedisClient, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    async with client.pipeline(transaction=False) as pipe:
        for command in commands:
            pipe.execute_command(*command)
        return await pipe.execute(raise_on_error=False)
