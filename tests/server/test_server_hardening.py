"""Request hardening on a real ``switchyard serve`` process: slow clients are cut off while
normal requests stay fast, oversized headers are refused, bodies are strict JSON, and no secret
shows up in the process's output, an error message or a metric."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fake_upstream import FakeUpstream
from marked_gateway import ADMIN_KEY, PEPPER, PROVIDER_KEY, MarkedGateway, write_policy

SLOW_CLIENTS = 40
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, fake_upstream: FakeUpstream
) -> Iterator[MarkedGateway]:
    directory: Path = tmp_path_factory.mktemp("hardening")
    with MarkedGateway(
        directory / "data",
        write_policy(directory, fake_upstream.base_url),
        header_timeout_s=1.5,
        body_timeout_s=1.5,
        max_header_bytes=8192,
        keep_alive_timeout_s=2,
    ) as process:
        yield process


def _connect(gateway: MarkedGateway) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        data = sock.recv(65536)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def test_slow_clients_are_cut_off_while_normal_requests_are_served(
    gateway: MarkedGateway,
) -> None:
    _, key = gateway.create_key(name="fast")
    head_trickle = [_connect(gateway) for _ in range(SLOW_CLIENTS // 2)]
    for sock in head_trickle:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    body_trickle = [_connect(gateway) for _ in range(SLOW_CLIENTS // 2)]
    for sock in body_trickle:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Bearer " + key.encode() + b"\r\n"
            b'Content-Type: application/json\r\nContent-Length: 500\r\n\r\n{"model"'
        )
    started = time.monotonic()
    latencies = []
    with httpx.Client(base_url=gateway.base_url, headers={"Authorization": f"Bearer {key}"}) as c:
        for _ in range(20):
            sent = time.perf_counter()
            reply = c.post("/v1/chat/completions", json={"model": "fake", "messages": HI})
            latencies.append(time.perf_counter() - sent)
            assert reply.status_code == 200
            for sock in head_trickle:  # keep trickling, a byte at a time
                sock.sendall(b"a")
    assert max(latencies) < 0.5, latencies

    for sock in head_trickle:
        answer = _read_all(sock)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
        assert b"request_timeout" in answer
        sock.close()
    for sock in body_trickle:
        answer = _read_all(sock)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
        sock.close()
    # Cut off on the deadline, not when the test stopped waiting.
    assert time.monotonic() - started < 5


def test_idle_connection_without_a_request_is_closed(gateway: MarkedGateway) -> None:
    sock = _connect(gateway)
    started = time.monotonic()
    assert _read_all(sock).startswith(b"HTTP/1.1 408")
    assert 1.0 < time.monotonic() - started < 4
    sock.close()


def test_a_stalled_body_is_logged_as_the_408_it_got(gateway: MarkedGateway) -> None:
    _, key = gateway.create_key(name="stalled")
    sock = _connect(gateway)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-ID: stalled-408\r\n"
        b"Authorization: Bearer " + key.encode() + b"\r\n"
        b'Content-Type: application/json\r\nContent-Length: 500\r\n\r\n{"model"'
    )
    assert _read_all(sock).startswith(b"HTTP/1.1 408")
    sock.close()
    deadline = time.monotonic() + 5
    lines: list[dict] = []
    while not lines and time.monotonic() < deadline:
        time.sleep(0.1)  # the JSON log is flushed a few times a second
        lines = [
            json.loads(line)
            for line in gateway.output().splitlines()
            if '"request_id":"stalled-408"' in line and '"event":"request"' in line
        ]
    assert [line["status"] for line in lines] == [408]


def test_oversized_headers_get_431(gateway: MarkedGateway) -> None:
    reply = httpx.get(gateway.base_url + "/healthz", headers={"X-Big": "x" * 10_000})
    assert reply.status_code == 431
    assert reply.json()["error"]["code"] == "headers_too_large"
    sock = _connect(gateway)  # one huge header trickled in without ever ending
    sock.sendall(b"GET /healthz HTTP/1.1\r\nX-Big: ")
    for _ in range(3):
        sock.sendall(b"y" * 4000)
    assert _read_all(sock).startswith(b"HTTP/1.1 431")
    sock.close()


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"model": "fake", "model": "other", "messages": []}', "more than once"),
        (
            b'{"model": "fake", "messages": [{"role": "user", "content": "x"}], "top_p": NaN}',
            "JSON",
        ),
        (b'{"model": "fake", "messages": [], "temperature": Infinity}', "JSON"),
        (b'{"model": "fake", "messages": [{"role": "user", "content": "\xff\xfe"}]}', "UTF-8"),
        (b'{"model": "fake", "messages": [{"role": "user", "content": "\\ud800"}]}', "surrogate"),
    ],
)
def test_ambiguous_or_malformed_json_is_a_400(
    gateway: MarkedGateway, body: bytes, says: str
) -> None:
    _, key = gateway.create_key(name="json")
    reply = httpx.post(
        gateway.v1 + "/chat/completions",
        content=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    assert reply.status_code == 400, reply.text
    assert says in reply.json()["error"]["message"]


MALFORMED_HTTP = {
    "bad request line": b"GET /v1/models HTTP/1.1 extra\r\nHost: x\r\n\r\n",
    "bad method": b"G(T /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
    "control character in the path": b"GET /v1/\x01models HTTP/1.1\r\nHost: x\r\n\r\n",
    "header without a colon": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nNo colon here\r\n\r\n",
    "two content lengths": (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}"
    ),
    "invalid chunk size": (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
    ),
}


def _unparsed_400s(gateway: MarkedGateway) -> float:
    text = httpx.get(gateway.base_url + "/metrics").text
    for line in text.splitlines():
        labels = line.partition("}")[0]
        wanted = ("switchyard_requests_total{", 'route="unparsed"', 'status="400"')
        if labels.startswith(wanted[0]) and all(part in labels for part in wanted[1:]):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("request_bytes", MALFORMED_HTTP.values(), ids=MALFORMED_HTTP.keys())
def test_http_parser_errors_get_the_json_envelope(
    gateway: MarkedGateway, request_bytes: bytes
) -> None:
    before = _unparsed_400s(gateway)
    sock = _connect(gateway)
    sock.sendall(request_bytes)
    reply = _read_all(sock)
    sock.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), reply
    assert b"content-type: application/json" in head.lower()
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_http_request" and error["type"] == "invalid_request_error"
    assert error["message"].startswith("the request is not valid HTTP/1.1: ")
    assert _unparsed_400s(gateway) == before + 1  # counted, though the app never saw it


def _read_answer(sock: socket.socket, buffered: bytearray, *, head_only: bool = False) -> bytes:
    """One whole answer off a kept-alive connection (its head, and its body by content-length)."""
    while b"\r\n\r\n" not in buffered:
        data = sock.recv(65536)
        assert data, bytes(buffered)
        buffered += data
    end = buffered.index(b"\r\n\r\n") + 4
    head = bytes(buffered[:end]).lower()
    length = 0 if head_only else int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(buffered) < end + length:
        buffered += sock.recv(65536)
    answer = bytes(buffered[: end + length])
    del buffered[: end + length]
    return answer


def test_heads_without_bodies_continues_and_pipelined_answers_keep_their_order(
    gateway: MarkedGateway,
) -> None:
    # What an answer writes in one turn leaves together (server/joined_writes.py): a HEAD
    # answer, a 100 Continue and answers queued behind each other must still all arrive.
    _, key = gateway.create_key(name="wire")
    body = json.dumps({"model": "fake", "messages": HI}).encode()
    buffered = bytearray()
    with _connect(gateway) as sock:
        sock.sendall(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        head = _read_answer(sock, buffered, head_only=True)
        assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n"), head
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Authorization: Bearer " + key.encode() + b"\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        )
        assert _read_answer(sock, buffered, head_only=True) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        answer = _read_answer(sock, buffered)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["object"] == "chat.completion"
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
        for _ in range(3):
            assert _read_answer(sock, buffered).startswith(b"HTTP/1.1 200")
        assert not buffered


def test_no_secret_in_logs_errors_or_metrics(gateway: MarkedGateway) -> None:
    key_id, key = gateway.create_key(name="secret-check")
    with gateway.admin() as admin:
        rotated = admin.post(f"/admin/keys/{key_id}/rotate", json={"grace_seconds": 60}).json()
    secrets = [ADMIN_KEY, PEPPER, PROVIDER_KEY, key, rotated["key"]]
    replies = []
    for token in (key, rotated["key"], key + "x", ADMIN_KEY, "sk-sy-" + PEPPER):
        headers = {"Authorization": f"Bearer {token}"}
        replies.append(
            httpx.post(
                gateway.v1 + "/chat/completions",
                json={"model": "fake", "messages": HI},
                headers=headers,
            )
        )
        replies.append(httpx.post(gateway.v1 + "/chat/completions", content=b"{", headers=headers))
        replies.append(httpx.get(gateway.base_url + "/admin/keys", headers=headers))
    replies.append(httpx.get(gateway.base_url + "/metrics"))
    assert {reply.status_code for reply in replies} >= {200, 400, 401, 403}
    time.sleep(0.5)  # the access log is flushed a few times a second
    gateway.stop()  # and everything left at shutdown
    output = gateway.output()
    assert '"event":"request"' in output  # the log did capture the requests
    for secret in secrets:
        assert secret not in output
        for reply in replies:  # error messages, key listings and /metrics
            assert secret not in reply.text
