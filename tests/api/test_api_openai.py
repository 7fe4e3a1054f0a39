"""The /v1 API through the official openai SDK: sync, async and streaming, against a loopback
upstream named in the policy file."""

from __future__ import annotations

import socket
import time

import httpx
import openai
import orjson
from fake_upstream import CONTENT, PROMPT_TOKENS, FakeUpstream
from gateway_runner import RunningGateway
from polling import wait_for


def _client(gateway: RunningGateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=10)


def test_sync_chat_completion_with_route_headers(gateway: RunningGateway, key: str) -> None:
    client = _client(gateway, key)
    raw = client.chat.completions.with_raw_response.create(
        model="fake",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=7,
        extra_headers={"X-Request-ID": "req-abc-123"},
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == CONTENT
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == PROMPT_TOKENS
    assert completion.usage.completion_tokens == 7
    assert raw.headers["x-request-id"] == "req-abc-123"
    assert raw.headers["x-switchyard-model"] == "fake-model"
    assert raw.headers["x-switchyard-provider"] == "fake"
    assert "alias fake" in raw.headers["x-switchyard-route"]


async def test_async_chat_completion_sends_upstream_model(
    gateway: RunningGateway, key: str, fake_upstream: FakeUpstream
) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=10)
    completion = await client.chat.completions.create(
        model="other", messages=[{"role": "user", "content": "which model?"}]
    )
    assert completion.model == "fake-other"
    seen = [r for r in fake_upstream.requests if r.body.get("model") == "fake-other"]
    assert seen and seen[-1].body["messages"] == [{"role": "user", "content": "which model?"}]
    await client.close()


def test_stream_relays_chunks_and_hides_usage_unless_asked(
    gateway: RunningGateway, key: str, fake_upstream: FakeUpstream
) -> None:
    client = _client(gateway, key)
    chunks = list(
        client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == CONTENT
    assert all(c.choices for c in chunks), "the usage-only chunk must not reach this client"
    # Upstream was asked for usage regardless, so limits and usage records are exact.
    assert fake_upstream.requests[-1].body["stream_options"] == {"include_usage": True}


def test_stream_with_include_usage_gets_the_usage_chunk(gateway: RunningGateway, key: str) -> None:
    client = _client(gateway, key)
    chunks = list(
        client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            max_tokens=9,
            stream_options={"include_usage": True},
        )
    )
    final = chunks[-1]
    assert final.choices == []
    assert final.usage is not None and final.usage.completion_tokens == 9


def test_stream_is_relayed_as_it_arrives(gateway: RunningGateway, key: str) -> None:
    """The drip upstream waits 0.3 s between chunks: the first must arrive long before the end."""
    client = _client(gateway, key)
    started = time.perf_counter()
    arrivals = []
    for chunk in client.chat.completions.create(
        model="drip-model", messages=[{"role": "user", "content": "hi"}], stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter() - started)
    assert len(arrivals) == 5
    assert arrivals[-1] - arrivals[0] > 1.0
    assert arrivals[0] < 0.5 * arrivals[-1]


def _http_chunks(raw: bytes) -> list[bytes]:
    """The chunks of a chunked HTTP/1.1 answer, as framed on the wire (the last, empty one
    left out)."""
    body = raw.split(b"\r\n\r\n", 1)[1]
    chunks = []
    while True:
        size_line, body = body.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            return chunks
        chunks.append(body[:size])
        body = body[size + 2 :]


def test_a_burst_of_events_goes_on_in_one_write(gateway: RunningGateway, key: str) -> None:
    """The burst upstream sends its whole stream in one write: the client gets its events in
    one chunk, then the end, sent once the usage record is durable (gateway/api/v1/stream.py)."""
    body = orjson.dumps(
        {"model": "burst-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    )
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Authorization: Bearer " + key.encode() + b"\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        raw = b""
        while data := sock.recv(65536):
            raw += data
    assert raw.startswith(b"HTTP/1.1 200"), raw[:300]
    events, end = _http_chunks(raw)
    datas = [e.removeprefix(b"data: ") for e in events.split(b"\n\n") if e]
    text = "".join(
        choice["delta"].get("content") or ""
        for data in datas
        for choice in orjson.loads(data)["choices"]
    )
    assert text == CONTENT
    assert end == b"data: [DONE]\n\n"


def test_completions_plain_and_streamed(gateway: RunningGateway, key: str) -> None:
    client = _client(gateway, key)
    completion = client.completions.create(model="fake-model", prompt="Say hi", max_tokens=3)
    assert completion.choices[0].text == CONTENT
    assert completion.usage is not None and completion.usage.completion_tokens == 3
    pieces = [
        c.choices[0].text
        for c in client.completions.create(model="fake-model", prompt="Say hi", stream=True)
        if c.choices
    ]
    assert "".join(pieces) == CONTENT


def test_embeddings_and_images(gateway: RunningGateway, key: str) -> None:
    client = _client(gateway, key)
    embeddings = client.embeddings.create(model="embed-model", input=["a", "b"])
    assert [item.index for item in embeddings.data] == [0, 1]
    assert embeddings.data[0].embedding == [0.1, 0.2, 0.3]
    image = client.images.generate(model="image-model", prompt="a cat")
    assert image.data is not None and image.data[0].url == "https://example.invalid/fake.png"


def test_models_lists_what_the_key_may_use(gateway: RunningGateway) -> None:
    _, unrestricted = gateway.create_key(name="all")
    listed = {m.id for m in _client(gateway, unrestricted).models.list()}
    assert {"fake-model", "other-model", "fake", "other", "embed-model"} <= listed
    _, restricted = gateway.create_key(name="one", models=["fake"])
    models = list(_client(gateway, restricted).models.list())
    assert {m.id for m in models} == {"fake-model", "fake"}
    assert all(m.object == "model" and m.owned_by == "fake" for m in models)


def test_allow_list_refuses_other_models(gateway: RunningGateway) -> None:
    _, restricted = gateway.create_key(name="one", models=["fake-model"])
    client = _client(gateway, restricted)
    assert client.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "hi"}]
    ).choices
    try:
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
    except openai.PermissionDeniedError as exc:
        assert exc.status_code == 403
        assert "other" in exc.message
    else:
        raise AssertionError("a model outside the allow-list was served")


def test_access_log_has_one_line_per_request_and_no_secret(gateway: RunningGateway) -> None:
    key_id, secret_key = gateway.create_key(name="logged")
    httpx.post(
        gateway.v1 + "/chat/completions",
        headers={"Authorization": f"Bearer {secret_key}", "X-Request-ID": "log-line-check"},
        json={"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    )

    def logged() -> list[dict]:  # written once the answer's last byte is out
        lines = (orjson.loads(line) for line in gateway.log.getvalue().splitlines() if line.strip())
        return [line for line in lines if line.get("request_id") == "log-line-check"]

    mine = wait_for(logged, timeout_s=5)
    assert len(mine) == 1
    entry = mine[0]
    assert entry["key_id"] == key_id
    assert entry["model"] == "fake-model" and entry["provider"] == "fake"
    assert entry["status"] == 200 and entry["completion_tokens"] == 4
    assert isinstance(entry["latency_ms"], float)
    assert secret_key.rsplit("-", 1)[1] not in gateway.log.getvalue()


def test_metrics_endpoint_counts_requests(gateway: RunningGateway, key: str) -> None:
    _client(gateway, key).chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "hi"}]
    )
    text = httpx.get(gateway.base_url + "/metrics").text
    assert (
        'switchyard_requests_total{model="fake-model",provider="fake",route="chat.completions",status="200"}'
        in text
    )
    assert "switchyard_request_duration_seconds_bucket" in text


def test_health_and_readiness(gateway: RunningGateway) -> None:
    assert httpx.get(gateway.base_url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(gateway.base_url + "/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"]["redis"] == "ok"
