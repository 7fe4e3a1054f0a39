"""Chat load over several gateway replicas on one Redis (or Redis Cluster), for the tests that
prove limits stay exact across replicas: concurrent requests spread round-robin, and the
outcomes counted by status (a 429 by its error type)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
from gateway_runner import AdminClient, GatewayProcess, running_gateways

from gateway.money import usd_to_nanos

# 24 characters: the gateway's typical prompt estimate is exactly the fake upstream's 10 tokens.
MESSAGES = [{"role": "user", "content": "x" * 24}]
TOKENS_PER_REQUEST = 15
COST_PER_REQUEST = 0.02  # fake-model: 10 × $1000/M + 5 × $2000/M
COST_NANOS_PER_REQUEST = usd_to_nanos(COST_PER_REQUEST)
# What the limiter holds for one CHAT until it settles: the prompt's upper bound (64 + 16
# framing + 39 bytes of the message's JSON text = 119 tokens) + max_tokens 5. A burst is
# admitted against holds, so it gets between limit // hold and limit // usage requests.
HOLD_TOKENS_PER_REQUEST = 124
HOLD_NANOS_PER_REQUEST = usd_to_nanos(0.129)  # 119 × $1000/M + 5 × $2000/M
CHAT = {"model": "fake-model", "messages": MESSAGES, "max_tokens": 5}


def replicas_on(
    redis_url: str,
    count: int,
    data_dir: Path,
    policy_file: Path,
    on_redis_failure: str = "closed",
) -> AbstractContextManager[list[GatewayProcess]]:
    """``count`` gateway processes on one Redis, running for the block: one try per candidate
    (so counts stay exact) and no access lines."""
    return running_gateways(
        count,
        data_dir,
        policy_file,
        redis_url=redis_url,
        limits_on_redis_failure=on_redis_failure,
        upstream_max_tries=1,
        access_log="false",
    )


def new_key(gateway: AdminClient, **fields: object) -> str:
    """A new API key made on ``gateway``; the key alone."""
    return gateway.create_key(**fields)[1]


def key_id_of(key: str) -> str:
    """The id part of an API key (``sk-sy-<id>-<secret>``): what its limiter keys are named by."""
    return key.removeprefix("sk-sy-").split("-", 1)[0]


def create_team(gateway: AdminClient, team_id: str, **limits: object) -> dict[str, Any]:
    """A new team made on ``gateway``: its record."""
    with gateway.admin() as admin:
        response = admin.post("/admin/teams", json={"id": team_id, **limits})
    assert response.status_code == 201, response.text
    return response.json()


def key_to_move(
    gateway: AdminClient, red: str, blue: str, budget_usd: float, period: str
) -> tuple[str, str]:
    """Teams ``red`` and ``blue`` (rpm 10,000, so only the key's budget binds) and a key of
    ``red`` with ``budget_usd`` per ``period``, for the tests that move it to ``blue``: (its
    id, the key)."""
    for team in (red, blue):
        create_team(gateway, team, rpm=10_000)
    return gateway.create_key(name="mover", team=red, budget_usd=budget_usd, budget_period=period)


async def fire(urls: list[str], key: str | list[str], total: int) -> list[httpx.Response]:
    """``total`` concurrent chat requests spread round-robin over the gateways (and over the
    keys, when given several)."""
    keys = [key] if isinstance(key, str) else key
    limits = httpx.Limits(max_connections=total, max_keepalive_connections=total)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        return await asyncio.gather(
            *(
                client.post(
                    urls[i % len(urls)] + "/v1/chat/completions",
                    json=CHAT,
                    headers={"Authorization": f"Bearer {keys[i % len(keys)]}"},
                )
                for i in range(total)
            )
        )


def outcomes(responses: list[httpx.Response]) -> Counter:
    counted: Counter = Counter()
    for response in responses:
        if response.status_code == 429:
            counted[f"429 {response.json()['error']['type']}"] += 1
        else:
            counted[str(response.status_code)] += 1
    return counted


def chat(url: str, key: str) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        json=CHAT,
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )


def chat_until(url: str, key: str, status: int, timeout: float = 10) -> httpx.Response:
    """Chat until the answer has ``status`` (or the time is up): the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        response = chat(url, key)
        if response.status_code == status or time.monotonic() > deadline:
            return response
        time.sleep(0.1)
