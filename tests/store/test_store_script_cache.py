"""Settles go to Redis as EVALSHA beside the usage records: an empty script cache (SCRIPT FLUSH,
or a Redis restart) between requests must neither lose nor double-count anything, NOSCRIPT falls
back to EVAL on the same connection, and any error reply on the hot path is a 503, never a
500."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest
import redis as sync_redis
import redis.asyncio
from gateway_runner import GatewayThread, RunningGateway, make_settings
from ports import free_port

from gateway.metering.limits import KeyLimits, Limiter
from gateway.money import usd_to_nanos
from gateway.store.connect import connect_redis
from gateway.store.direct import DirectRedis
from gateway.store.embedded import EmbeddedRedis, redis_server_binary
from gateway.store.scripts import LuaScript, ScriptBatch

HI = [{"role": "user", "content": "x" * 24}]
LIMITS = KeyLimits(rpm=1000, tpm=1_000_000, budget_nanos=usd_to_nanos(100.0), budget_period="day")


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def _create_limited_key(gateway: RunningGateway) -> tuple[str, str]:
    return gateway.create_key(
        name="script-cache",
        rpm=LIMITS.rpm,
        tpm=LIMITS.tpm,
        budget_usd=100.0,
        budget_period=LIMITS.budget_period,
    )


def _usage(gateway: RunningGateway, key: str) -> dict:
    """``/v1/usage`` once every answered request is in the usage store."""
    gateway.wait_exported()
    response = httpx.get(gateway.v1 + "/usage", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    return response.json()


async def _ask(client: openai.AsyncOpenAI, max_tokens: int, stream: bool) -> int:
    """One request; returns the total tokens the upstream reported."""
    if not stream:
        answer = await client.chat.completions.create(
            model="fake",
            messages=HI,  # type: ignore[arg-type]
            max_tokens=max_tokens,
        )
        assert answer.usage is not None
        return answer.usage.total_tokens
    total = 0
    chunks = await client.chat.completions.create(
        model="fake",
        messages=HI,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in chunks:
        if chunk.usage is not None:
            total = chunk.usage.total_tokens
    assert total > 0
    return total


async def _assert_books(
    redis_url: str, gateway: RunningGateway, key_id: str, key: str, requests: int, tokens: int
) -> None:
    """Every request settled exactly once and recorded exactly once."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        status = await Limiter(client).status(key_id, LIMITS)
    finally:
        await client.aclose()
    assert status["in_flight"] == 0  # no reservation left unsettled
    assert status["budget"]["reserved_nanos"] == 0
    assert status["requests"]["used"] == requests
    assert status["tokens"]["used"] == tokens  # estimates replaced by what was used, once
    usage = _usage(gateway, key)
    assert usage["requests"] == requests
    assert usage["total_tokens"] == tokens
    assert status["budget"]["spent_nanos"] == usage["total_cost_nanos"]
    assert gateway.services.recorder.spool_depth() == 0  # nothing fell back to the spool


async def test_script_flush_between_requests_loses_and_doubles_nothing(
    gateway: RunningGateway, redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    key_id, key = _create_limited_key(gateway)
    client = openai.AsyncOpenAI(base_url=gateway.v1, api_key=key, max_retries=0)
    tokens = 0
    for index in range(6):
        await redis_client.script_flush()  # the next settle and record get NOSCRIPT
        tokens += await _ask(client, max_tokens=3 + index, stream=index % 2 == 1)
    await client.close()
    await _assert_books(redis_url, gateway, key_id, key, requests=6, tokens=tokens)


async def test_redis_restart_between_requests_loses_and_doubles_nothing(
    own_redis: EmbeddedRedis, fake_policy: Path, tmp_path: Path
) -> None:
    runner = GatewayThread(make_settings(tmp_path / "gw", fake_policy, own_redis.url))
    gateway = runner.start()
    try:
        key_id, key = _create_limited_key(gateway)
        client = openai.AsyncOpenAI(base_url=gateway.v1, api_key=key, max_retries=0)
        tokens = await _ask(client, max_tokens=4, stream=False)
        own_redis.kill()
        own_redis.start()  # the data survives (append-only file), the script cache does not
        tokens += await _ask(client, max_tokens=5, stream=False)
        tokens += await _ask(client, max_tokens=6, stream=True)
        await client.close()
        await _assert_books(own_redis.url, gateway, key_id, key, requests=3, tokens=tokens)
    finally:
        runner.stop()


def _run_id(client: redis.Redis) -> str:
    return str(client.info("server")["run_id"])


async def test_second_server_on_the_socket_path_never_strands_a_script(tmp_path: Path) -> None:
    """The issue-13 scenario: a second Redis takes over the unix socket while the first still
    runs. Connections already open reach the first, new ones the second, so a SCRIPT LOAD on a
    new connection never helps an EVALSHA on an old one: the run must go as EVAL on the same
    connection, for the limiter's own calls and for a pipelined ``ScriptBatch`` alike."""
    first_port = free_port()
    first = EmbeddedRedis(tmp_path / "one", extra_args=["--port", str(first_port)])
    first.start()
    first_control = sync_redis.Redis(port=first_port)
    second: subprocess.Popen[bytes] | None = None
    client = connect_redis(first.url, 1.0)
    try:
        limiter = Limiter(client)
        direct = DirectRedis(client)
        limits = KeyLimits(rpm=100)
        await limiter.reserve("stranded", limits, tokens=1, cost_nanos=0, request_id="r1")
        assert await direct.call("PING")  # a connection to the first server, kept idle

        (tmp_path / "two").mkdir()
        second = subprocess.Popen(
            [
                redis_server_binary(),
                *("--port", "0", "--unixsocket", str(first.socket_path)),
                *("--dir", str(tmp_path / "two"), "--save", "", "--appendonly", "no"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        first_id = _run_id(first_control)
        deadline = time.monotonic() + 10
        while True:  # until a new connection on the path reaches the second server
            with contextlib.suppress(sync_redis.RedisError, OSError):
                probe = sync_redis.Redis(unix_socket_path=str(first.socket_path))
                if _run_id(probe) != first_id:
                    break
            assert time.monotonic() < deadline, "the second server never took the socket"
            time.sleep(0.05)
        first_control.script_flush()  # the first server's cache is empty: NOSCRIPT

        await limiter.reserve("stranded", limits, tokens=1, cost_nanos=0, request_id="r2")
        batch = ScriptBatch()
        position = batch.call(LuaScript.of(COUNT), ["counted"], [])
        first_control.script_flush()
        assert (await batch.execute(direct))[position] == 1
        # Everything ran on the first server, where the old connections go.
        assert first_control.get("counted") == b"1"
        assert sum(1 for _ in first_control.scan_iter("sy:{key:stranded}:*")) > 0
        probe = sync_redis.Redis(unix_socket_path=str(first.socket_path))
        assert probe.get("counted") is None  # the second server saw none of it
    finally:
        await client.aclose()
        if second is not None:
            second.kill()
            second.wait()
        first_control.close()
        first.stop()


COUNT = "return redis.call('INCR', KEYS[1])"


async def test_error_replies_on_the_hot_path_are_503_not_500(
    own_redis: EmbeddedRedis, fake_policy: Path, tmp_path: Path
) -> None:
    """A Redis that answers with an error (here a master refusing writes without replicas:
    NOREPLICAS, after a SCRIPT FLUSH so the EVAL fallback runs too) is a 503
    ``redis_unavailable`` for limited keys, never a 500; service comes back by itself."""
    runner = GatewayThread(make_settings(tmp_path / "gw", fake_policy, own_redis.url))
    gateway = runner.start()
    control = sync_redis.Redis.from_url(own_redis.url)
    try:
        _, key = _create_limited_key(gateway)
        client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0)
        assert client.chat.completions.create(model="fake", messages=HI).usage  # type: ignore[arg-type]
        control.script_flush()
        control.config_set("min-replicas-to-write", 1)
        for _ in range(3):
            with pytest.raises(openai.APIStatusError) as caught:
                client.chat.completions.create(model="fake", messages=HI)  # type: ignore[arg-type]
            assert caught.value.status_code == 503
            assert caught.value.code == "redis_unavailable"
        control.config_set("min-replicas-to-write", 0)
        assert client.chat.completions.create(model="fake", messages=HI).usage  # type: ignore[arg-type]
        assert "unhandled_error" not in gateway.log.getvalue()
    finally:
        control.config_set("min-replicas-to-write", 0)
        control.close()
        runner.stop()
