"""The native provider adapters against loopback upstreams of their own format: Anthropic's
headers and errors, Azure OpenAI's deployment URLs, which client headers go upstream (never a
hop-by-hop or credential one, whatever the policy says), and an upstream's mid-stream error
reaching clients of every format scrubbed and in their own envelope."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from gateway_runner import GatewayThread, RunningGateway, make_settings
from native_anthropic import FakeAnthropic
from native_gateway import ANTHROPIC_KEY, AZURE_KEY, KEY_ENV, native_fleet, native_policy
from native_openai import FakeAzure
from native_upstreams import NativeFleet
from starlette.datastructures import Headers

from gateway.errors import UpstreamError
from gateway.policy import PolicyError, ProviderConfig, validate_policy_data
from gateway.providers.anthropic import AnthropicProvider
from gateway.providers.azure_openai import AzureOpenAIProvider
from gateway.providers.forwarding import forwarded_headers
from gateway.settings import UpstreamSettings

SETTINGS = UpstreamSettings(connect_timeout_s=2, read_timeout_s=5, total_timeout_s=10)
HOSTILE = {
    "authorization": "Bearer sk-sy-client",
    "x-api-key": "sk-sy-client",
    "api-key": "sk-sy-client",
    "cookie": "a=b",
    "proxy-authorization": "Basic eA==",
    "proxy-foo": "1",
    "connection": "upgrade",
    "te": "trailers",
    "upgrade": "h2c",
    "host": "evil.example",
    "content-length": "5",
    "transfer-encoding": "chunked",
    "x-forwarded-for": "10.0.0.1",
    "anthropic-beta": "tools-2024",
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "congo=t61rcWkgMzE",
    "x-request-id": "client-chosen",
    "x-other": "not listed",
}


def test_only_trace_context_the_request_id_and_listed_headers_go() -> None:
    allow = ["anthropic-beta", "Authorization", "cookie", "Host", "x-request-id"]
    sent = forwarded_headers(Headers(HOSTILE), allow, "gw-request-1")
    assert sent == {
        "x-request-id": "gw-request-1",
        "traceparent": HOSTILE["traceparent"],
        "tracestate": HOSTILE["tracestate"],
        "anthropic-beta": "tools-2024",
    }


@pytest.mark.parametrize("name", ["Authorization", "x-api-key", "api-key", "Proxy-Thing", "TE"])
def test_a_policy_may_not_list_a_credential_or_hop_by_hop_header(name: str) -> None:
    with pytest.raises(PolicyError) as caught:
        validate_policy_data(
            {"providers": {"p": {"base_url": "http://x", "forward_headers": [name]}}, "models": {}}
        )
    assert caught.value.path == "providers.p" and "forward_headers[0]" in caught.value.message


def test_kind_fields_are_checked() -> None:
    cases = [
        ({"kind": "azure_openai"}, "base_url is required"),
        ({"base_url": "http://x", "api_version": "1"}, "only to an azure_openai"),
        ({"kind": "anthropic", "formats": ["openai_chat"]}, "formats of a anthropic"),
        ({"kind": "local", "anthropic_version": "x"}, "only to an anthropic"),
    ]
    for provider, words in cases:
        with pytest.raises(PolicyError) as caught:
            validate_policy_data({"providers": {"p": provider}, "models": {}})
        assert words in str(caught.value), provider


@pytest.fixture(scope="module")
def upstreams() -> Iterator[NativeFleet]:
    with native_fleet() as fleet:
        yield fleet


async def test_anthropic_sends_its_own_headers_and_reads_its_errors(
    upstreams: NativeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake: FakeAnthropic = upstreams["anthropic"]
    monkeypatch.setenv("ANTHROPIC_TEST_KEY", ANTHROPIC_KEY)
    config = ProviderConfig(kind="anthropic", base_url=fake.url, api_key_env="ANTHROPIC_TEST_KEY")
    provider = AnthropicProvider("claude", config, SETTINGS)
    body = {
        "model": "ctx-overflow",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "x"}],
    }
    try:
        with pytest.raises(UpstreamError) as caught:
            await provider.post_json("/messages", body, headers={"x-request-id": "r1"})
        assert caught.value.status == 400 and caught.value.code == "context_length_exceeded"
        assert caught.value.upstream_body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        seen = fake.seen[-1]
        assert seen.headers["x-api-key"] == ANTHROPIC_KEY
        assert seen.headers["anthropic-version"] == "2023-06-01"
        assert seen.headers["x-request-id"] == "r1"
        with pytest.raises(UpstreamError) as unsupported:
            await provider.post_json("/embeddings", {"model": "x"})
        assert unsupported.value.kind == "unsupported" and unsupported.value.status == 400
    finally:
        await provider.close()
    monkeypatch.setenv("ANTHROPIC_TEST_KEY", "sk-ant-wrong-key-0000")
    wrong = AnthropicProvider("claude", config, SETTINGS)
    try:
        with pytest.raises(UpstreamError) as refused:
            await wrong.post_json("/messages", {**body, "model": "claude"})
        assert refused.value.status == 502 and refused.value.code == "upstream_auth_failed"
        assert "sk-ant-wrong" not in refused.value.message
    finally:
        await wrong.close()


async def test_azure_urls_name_the_deployment_and_the_api_version(
    upstreams: NativeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake: FakeAzure = upstreams["azure"]
    monkeypatch.setenv("AZURE_TEST_KEY", AZURE_KEY)
    config = ProviderConfig(
        kind="azure_openai",
        base_url=fake.url,
        api_key_env="AZURE_TEST_KEY",
        api_version="2024-10-21",
        deployments={"gpt-4o": "prod gpt/4o"},
    )
    provider = AzureOpenAIProvider("azure", config, SETTINGS)
    assert provider.url(provider.base_url, "/chat/completions", "gpt-4o") == (
        f"{fake.url}/openai/deployments/prod%20gpt%2F4o/chat/completions?api-version=2024-10-21"
    )
    try:
        body = {"model": "unmapped", "messages": [{"role": "user", "content": "hi"}]}
        reply = await provider.post_json("/chat/completions", body)
        assert reply.data["model"] == "unmapped"  # the deployment named after the model
        seen = fake.seen[-1]
        assert seen.path == "/openai/deployments/unmapped/chat/completions"
        assert seen.headers["api-key"] == AZURE_KEY and "authorization" not in seen.headers
        with pytest.raises(UpstreamError) as filtered:
            await provider.post_json("/chat/completions", {**body, "model": "filtered"})
        assert filtered.value.code == "content_filter"
        with pytest.raises(UpstreamError) as unsupported:
            await provider.post_json("/responses", body)
        assert unsupported.value.kind == "unsupported"
    finally:
        await provider.close()


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, upstreams: NativeFleet
) -> Iterator[tuple[RunningGateway, str]]:
    root: Path = tmp_path_factory.mktemp("native-providers")
    models = "  breaking:\n    provider: anthropic\n    upstream_model: mid-stream-error\n"
    with pytest.MonkeyPatch.context() as env:
        for name, value in KEY_ENV.items():
            env.setenv(name, value)
        policy = root / "routing_rules.yaml"
        policy.write_text(native_policy(upstreams, models=models))
        with GatewayThread(make_settings(root / "data", policy, redis_url)) as running:
            _, key = running.create_key(name="providers")
            yield running, key


def test_a_mid_stream_error_reaches_every_client_scrubbed(gateway) -> None:
    running, key = gateway
    messages = [{"role": "user", "content": "hi"}]
    sdk = anthropic.Anthropic(base_url=running.base_url, api_key=key, max_retries=0)
    with (
        pytest.raises(anthropic.APIStatusError) as caught,
        sdk.messages.stream(model="breaking", max_tokens=5, messages=messages) as stream,
    ):
        stream.get_final_message()
    text = str(caught.value.body)
    assert "Overloaded" in text and ANTHROPIC_KEY not in text
    chat = openai.OpenAI(base_url=running.v1, api_key=key, max_retries=0)
    with pytest.raises(openai.APIError) as raised:
        list(chat.chat.completions.create(model="breaking", messages=messages, stream=True))  # type: ignore[arg-type]
    assert ANTHROPIC_KEY not in str(raised.value) and "Overloaded" in str(raised.value)
    with httpx.stream(
        "POST",
        running.v1 + "/responses",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "breaking", "input": "hi", "stream": True},
    ) as response:
        body = response.read().decode()
    assert "event: error" in body and "event: response.failed" in body
    assert "response.completed" not in body and ANTHROPIC_KEY not in body
    gateway[0].wait_exported()  # the events are read from the usage store
    with gateway[0].admin() as admin:
        events = admin.get("/admin/usage/events", params={"limit": 3}).json()["data"]
    assert len(events) == 3  # the three broken streams above, each recorded
    assert all(event["status"] == 502 and event["streamed"] for event in events)
