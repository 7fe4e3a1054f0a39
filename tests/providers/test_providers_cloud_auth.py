"""How the cloud kinds authenticate and read their wire, part by part: Signature V4 against
botocore's own signer, the AWS event-stream decoder against botocore's parser, the Vertex
token source against a token endpoint that verifies the service account's JWT (minted, then
refreshed before it expires without making a request wait), and what each provider makes of
a refused credential or a throttle."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.eventstream import EventStreamBuffer
from cloud_gateway import (
    AWS_ACCESS_KEY,
    AWS_REGION,
    AWS_SECRET_KEY,
    GEMINI_KEY,
    CloudUpstreams,
)
from native_bedrock import encode_message, event_frame, exception_frame

from gateway.errors import UpstreamError
from gateway.policy import ProviderConfig
from gateway.providers.aws_eventstream import EventStreamDecoder, EventStreamError
from gateway.providers.aws_sigv4 import AwsCredentials, sign_v4
from gateway.providers.bedrock import BedrockProvider
from gateway.providers.gemini import GeminiProvider
from gateway.providers.google_auth import REFRESH_BEFORE_S, GoogleTokenSource
from gateway.routing.fault import counts_against_breaker
from gateway.settings import UpstreamSettings

SETTINGS = UpstreamSettings(connect_timeout_s=2, read_timeout_s=5, total_timeout_s=10)
STAMP = 1_767_225_600.0  # 2026-01-01T00:00:00Z


@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzEJr//////////session"])
@pytest.mark.parametrize(
    "url",
    [
        "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse",
        "https://bedrock-runtime.us-east-1.amazonaws.com/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Ainference-profile%2Fus.x/converse-stream",
        "http://127.0.0.1:8080/model/m/converse?b=2&a=1",
    ],
)
def test_sigv4_signs_as_botocore_does(token: str | None, url: str) -> None:
    body = b'{"messages":[{"role":"user","content":[{"text":"hi"}]}]}'
    ours = sign_v4(
        AwsCredentials(AWS_ACCESS_KEY, AWS_SECRET_KEY, token),
        AWS_REGION,
        "POST",
        url,
        {"content-type": "application/json"},
        body,
        now=STAMP,
    )
    request = AWSRequest(
        method="POST",
        url=url,
        data=body,
        headers={"content-type": "application/json", "x-amz-date": ours["x-amz-date"]},
    )
    if token:
        request.headers["x-amz-security-token"] = token
    request.context["timestamp"] = ours["x-amz-date"]
    signer = SigV4Auth(Credentials(AWS_ACCESS_KEY, AWS_SECRET_KEY, token), "bedrock", AWS_REGION)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    assert ours["x-amz-date"] == "20260101T000000Z"
    assert ours["authorization"].endswith(f"Signature={expected}")
    signed = "content-type;host;x-amz-date" + (";x-amz-security-token" if token else "")
    assert f"SignedHeaders={signed}," in ours["authorization"]
    assert ours.get("x-amz-security-token") == token


def test_the_event_stream_decodes_split_anywhere_as_botocore_parses_it() -> None:
    frames = [
        event_frame("messageStart", {"role": "assistant"}),
        event_frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "héllo"}}),
        exception_frame("throttlingException", "Rate exceeded."),
    ]
    wire = b"".join(frames)
    reference = EventStreamBuffer()
    reference.add_data(wire)
    expected = [(dict(m.headers), m.payload) for m in reference]
    for size in (1, 3, 7, len(wire)):
        decoder = EventStreamDecoder()
        decoded = []
        for start in range(0, len(wire), size):
            decoded.extend(decoder.feed(wire[start : start + size]))
        assert [(m.headers, m.payload) for m in decoded] == expected
        assert decoder.pending == 0
    cut = EventStreamDecoder()
    assert cut.feed(wire[:-5]) != [] and cut.pending > 0  # a stream cut inside a message


@pytest.mark.parametrize("where", ["prelude", "message"])
def test_a_corrupted_frame_is_refused(where: str) -> None:
    frame = bytearray(encode_message({":event-type": "messageStop"}, b'{"stopReason":"x"}'))
    frame[5 if where == "prelude" else 20] ^= 0x01
    with pytest.raises(EventStreamError, match=f"{where} CRC"):
        EventStreamDecoder().feed(bytes(frame))


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudUpstreams]:
    with CloudUpstreams(tmp_path_factory.mktemp("cloud-auth")) as fleet:
        yield fleet


async def test_a_vertex_token_is_minted_then_refreshed_before_it_expires(
    upstreams: CloudUpstreams,
) -> None:
    vertex = upstreams["vertex"]
    now = [0.0]
    source = GoogleTokenSource("vertex", str(upstreams.key_file), clock=lambda: now[0])
    before = len(vertex.assertions)
    first = await source.token()
    assert first.startswith("ya29.") and len(vertex.assertions) == before + 1
    claims = vertex.assertions[-1]
    assert claims["iss"] == json.loads(upstreams.key_file.read_text())["client_email"]
    expires_at = source._expires_at
    assert expires_at is not None
    now[0] = expires_at - REFRESH_BEFORE_S - 1  # not yet due
    assert await source.token() == first and len(vertex.assertions) == before + 1
    now[0] = expires_at - REFRESH_BEFORE_S + 1  # due: the old token goes, a refresh starts
    assert await source.token() == first
    assert source._background is not None
    await source._background
    assert len(vertex.assertions) == before + 2
    second = await source.token()
    assert second != first and second.startswith("ya29.")
    now[0] = source._expires_at + 1  # type: ignore[operator]  # expired: the caller waits
    third = await source.token()
    assert third not in (first, second) and len(vertex.assertions) == before + 3


async def test_application_default_credentials_find_the_key_file(
    upstreams: CloudUpstreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``credentials_file``: google-auth's default chain reads
    ``GOOGLE_APPLICATION_CREDENTIALS`` (on GKE it would reach the metadata server instead)."""
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(upstreams.key_file))
    token = await GoogleTokenSource("vertex").token()
    assert upstreams["vertex"].issued(token)


async def test_a_service_account_key_the_endpoint_refuses_is_a_502(
    upstreams: CloudUpstreams, tmp_path: Path
) -> None:
    from native_gemini import service_account_json, service_account_key

    stranger = tmp_path / "other.json"
    stranger.write_text(
        json.dumps(service_account_json(service_account_key(), upstreams["vertex"].token_uri))
    )
    with pytest.raises(UpstreamError) as caught:
        await GoogleTokenSource("vertex", str(stranger)).token()
    assert caught.value.status == 502 and caught.value.code == "upstream_auth_failed"
    assert "PRIVATE KEY" not in caught.value.message
    assert counts_against_breaker(caught.value)


async def test_a_wrong_gemini_key_is_the_gateways_502(
    upstreams: CloudUpstreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ProviderConfig(kind="gemini", base_url=upstreams["gemini"].url, api_key_env="GK")
    body = {"model": "gemini-2.5-flash", "contents": [{"role": "user", "parts": [{"text": "x"}]}]}
    for key in ("AIzaSy-wrong-key-000", GEMINI_KEY):
        monkeypatch.setenv("GK", key)
        provider = GeminiProvider("gemini", config, SETTINGS)
        try:
            if key == GEMINI_KEY:
                reply = await provider.post_json("/generateContent", body)
                assert reply.data["candidates"][0]["finishReason"] == "STOP"
                continue
            with pytest.raises(UpstreamError) as caught:
                await provider.post_json("/generateContent", body)
            error = caught.value
            assert error.status == 502 and error.code == "upstream_auth_failed"
            assert counts_against_breaker(error) and "wrong-key" not in error.message
        finally:
            await provider.close()
    seen = upstreams["gemini"].seen[-1]
    assert seen.path == "/v1beta/models/gemini-2.5-flash:generateContent"
    assert "model" not in seen.body  # it is in the URL


async def test_bedrock_throttling_is_a_429_the_breaker_counts(
    upstreams: CloudUpstreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET_KEY)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    config = ProviderConfig(
        kind="bedrock", base_url=upstreams["bedrock"].url, bedrock={"region": AWS_REGION}
    )
    body = {"model": "throttled-x", "messages": [{"role": "user", "content": [{"text": "hi"}]}]}
    provider = BedrockProvider("bedrock", config, SETTINGS)
    try:
        with pytest.raises(UpstreamError) as caught:
            await provider.post_json("/converse", body)
        error = caught.value
        assert error.status == 429 and error.retryable and counts_against_breaker(error)
        assert error.message == "Too many requests, please wait before trying again."
        stream = await provider.open_stream("/converse", {**body, "model": "stream-throttled"})
        events = [event async for batch in stream.batches() for event in batch]
        assert json.loads(events[-1]) == {"throttlingException": {"message": "Rate exceeded."}}
    finally:
        await provider.close()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    wrong = BedrockProvider("bedrock", config, SETTINGS)
    try:
        with pytest.raises(UpstreamError) as refused:
            await wrong.post_json("/converse", {**body, "model": "m"})
        assert refused.value.status == 502 and refused.value.code == "upstream_auth_failed"
        assert refused.value.upstream_status == 403
    finally:
        await wrong.close()


def test_a_bedrock_provider_without_botocore_says_what_to_install() -> None:
    code = """
import sys
sys.modules["botocore"] = None  # the bedrock extra not installed
from gateway.errors import UpstreamError
from gateway.providers.bedrock import BedrockProvider
from gateway.settings import UpstreamSettings
from gateway.policy import ProviderConfig
config = ProviderConfig(kind="bedrock", bedrock={"region": "us-east-1"})
try:
    BedrockProvider("aws", config, UpstreamSettings(connect_timeout_s=1, read_timeout_s=1, total_timeout_s=1))
except UpstreamError as exc:
    print(exc.status, exc.code, exc.message)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == (
        "503 provider_unavailable provider aws of kind bedrock needs botocore: "
        "pip install 'switchyard-gateway[bedrock]'"
    ), out.stderr
