"""What an upstream says never reaches a client (or the log) unfiltered, and how much of it the
gateway reads is capped: a real ``switchyard serve`` process in front of a hostile loopback
upstream that quotes the gateway's provider key in its errors and sends 200 MB answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import orjson
import pytest
from hostile_provider import HostileUpstream
from loopback import ServedOnThread
from marked_gateway import PROVIDER_KEY, MarkedGateway

from gateway.providers.http_upstream import HttpUpstream
from gateway.settings import UpstreamSettings

MAX_BODY = 4 * 1024 * 1024
MAX_EVENT = 64 * 1024
HUGE = 200 * 1024 * 1024
HI = [{"role": "user", "content": "hi"}]

POLICY = """
providers:
  hostile:
    base_url: {base_url}
    api_key_env: OPS_TEST_PROVIDER_KEY
models:
{models}
"""
MODELS = (
    "leak-500", "text-500", "auth-401", "auth-403", "bad-400", "stream-error",
    "huge-json", "huge-sse", "huge-error", "ok",
)  # fmt: skip


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileUpstream]:
    with ServedOnThread(HostileUpstream(huge_bytes=HUGE)) as upstream:
        yield upstream


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, hostile: HostileUpstream
) -> Iterator[MarkedGateway]:
    directory: Path = tmp_path_factory.mktemp("upstream-text")
    models = "".join(f"  {name}:\n    provider: hostile\n" for name in MODELS)
    policy = directory / "routing_rules.yaml"
    policy.write_text(POLICY.format(base_url=hostile.url, models=models))
    with MarkedGateway(
        directory / "data",
        policy,
        upstream_max_tries=1,
        upstream_max_body_bytes=MAX_BODY,
        upstream_max_event_bytes=MAX_EVENT,
    ) as process:
        yield process


@pytest.fixture(scope="module")
def key(gateway: MarkedGateway) -> str:
    return gateway.create_key(name="hostile")[1]


def _chat(gateway: MarkedGateway, key: str, model: str, **extra: object) -> httpx.Response:
    return httpx.post(
        gateway.v1 + "/chat/completions",
        json={"model": model, "messages": HI, **extra},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc status")


@pytest.mark.parametrize("model", ["leak-500", "text-500"])
def test_upstream_5xx_text_is_scrubbed_and_cut(gateway: MarkedGateway, key: str, model: str):
    reply = _chat(gateway, key, model)
    assert reply.status_code == 502, reply.text
    assert PROVIDER_KEY not in reply.text and "OPSSECRET" not in reply.text
    error = reply.json()["error"]
    assert error["message"].startswith("upstream provider hostile failed with HTTP 500: ")
    assert "[redacted]" in error["message"]
    assert len(error["message"]) < 400  # the upstream sent ~14 KB


@pytest.mark.parametrize("status", [401, 403])
def test_upstream_auth_failure_is_a_502_naming_the_provider(
    gateway: MarkedGateway, key: str, status: int
) -> None:
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model=f"auth-{status}", messages=HI)  # type: ignore[arg-type]
    error = caught.value
    # Never the client's own 401 invalid_api_key: the client's key is fine.
    assert not isinstance(error, openai.AuthenticationError | openai.PermissionDeniedError)
    assert error.status_code == 502
    assert error.code == "upstream_auth_failed"
    assert "provider 'hostile' rejected the gateway's credentials" in error.message
    assert PROVIDER_KEY not in str(error.body)


def test_upstream_4xx_passes_through_scrubbed(gateway: MarkedGateway, key: str) -> None:
    reply = _chat(gateway, key, "bad-400")
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert PROVIDER_KEY not in reply.text
    assert error["message"].startswith("max_tokens is too large for key [redacted]")
    assert len(error["message"]) <= 300
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        "max_tokens",
        "invalid_value",
    )


def test_mid_stream_error_event_is_scrubbed(gateway: MarkedGateway, key: str) -> None:
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0)
    with pytest.raises(openai.APIError) as caught:
        for _ in client.chat.completions.create(
            model="stream-error",
            messages=HI,  # type: ignore[arg-type]
            stream=True,
        ):
            pass
    assert PROVIDER_KEY not in str(caught.value) and PROVIDER_KEY not in str(caught.value.body)
    assert "reported an error mid-stream: overloaded; retry with [redacted]" in str(caught.value)


def test_huge_json_answer_is_a_502_without_buffering_it(
    gateway: MarkedGateway, key: str, hostile: HostileUpstream
) -> None:
    assert gateway.process is not None
    peak_before = _peak_rss_kib(gateway.process.pid)
    reply = _chat(gateway, key, "huge-json")
    assert reply.status_code == 502, reply.text[:500]
    assert reply.json()["error"]["code"] == "upstream_response_too_large"
    assert str(MAX_BODY) in reply.json()["error"]["message"]
    growth_mib = (_peak_rss_kib(gateway.process.pid) - peak_before) / 1024
    print(f"\n200 MB answer, {MAX_BODY >> 20} MiB cap: peak RSS +{growth_mib:.0f} MiB")
    # Loose bound: reading the whole 200 MB answer (as before the cap) took RSS up by ~400 MB.
    assert growth_mib < 64, growth_mib
    assert hostile.sent["huge-json"] < HUGE // 2  # the gateway hung up early
    assert _chat(gateway, key, "ok").status_code == 200  # and the pool still serves


def test_huge_error_body_is_not_read_whole(
    gateway: MarkedGateway, key: str, hostile: HostileUpstream
) -> None:
    reply = _chat(gateway, key, "huge-error")
    assert reply.status_code == 502, reply.text[:500]
    assert len(reply.content) < 1000
    assert hostile.sent["huge-error"] < HUGE // 2


def test_huge_stream_event_ends_the_stream_with_an_error_event(
    gateway: MarkedGateway, key: str, hostile: HostileUpstream
) -> None:
    assert gateway.process is not None
    peak_before = _peak_rss_kib(gateway.process.pid)
    with httpx.stream(
        "POST",
        gateway.v1 + "/chat/completions",
        json={"model": "huge-sse", "messages": HI, "stream": True},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    ) as reply:
        assert reply.status_code == 200  # the stream had started: too late for a status
        text = reply.read().decode()
    assert '"content":"hello"' in text  # the first chunk was relayed
    assert "event: error" in text and "upstream_response_too_large" in text
    assert "[DONE]" not in text
    assert (_peak_rss_kib(gateway.process.pid) - peak_before) / 1024 < 64
    assert hostile.sent["huge-sse"] < HUGE // 2


def test_the_log_never_holds_the_provider_key(gateway: MarkedGateway, key: str) -> None:
    for model in ("leak-500", "text-500", "auth-401", "bad-400"):
        _chat(gateway, key, model)
    _chat(gateway, key, "stream-error", stream=True)
    output = gateway.output()
    assert '"status":502' in output.replace(" ", "")  # the failures were logged
    assert PROVIDER_KEY not in output and "OPSSECRET" not in output


async def test_a_cookie_an_upstream_sets_is_never_sent_on(hostile: HostileUpstream) -> None:
    """The upstream client is shared by every tenant: a cookie kept from one answer would go
    with everyone's next request to that provider. (By name: aiohttp's default jar keeps no
    cookie of a bare IP address.)"""
    upstream = HttpUpstream("hostile", UpstreamSettings())
    url = hostile.url.replace("127.0.0.1", "localhost") + "/chat/completions"
    try:
        for user in ("a", "b", ""):
            body = orjson.dumps({"model": "set-cookie" if user else "ok", "user": user})
            reply = await upstream.post_json(url, body, {"Content-Type": "application/json"})
            assert reply.status == 200
    finally:
        await upstream.close()
    assert hostile.cookies_seen == []
