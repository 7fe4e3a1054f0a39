"""Issue 26, item 3: token-dense text cannot spend past a hard budget or a tpm limit.

A real gateway process in front of the counting provider, whose ``chars`` model bills one
prompt token per character (as tokenizers bill CJK text). The limiter used to reserve about
four characters a token, so 40 concurrent prompts of 4,000 x '漢' were admitted against holds
a quarter of what they cost; now it reserves an upper bound (UTF-8 bytes plus framing), and
what the provider billed stays within the limit, whatever the interleaving.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from counting_provider import CountingProvider
from gateway_runner import GatewayProcess
from usage_workload import metered_gateway

PROMPT = "漢" * 4000  # 12,000 UTF-8 bytes, billed 4,000 tokens
MAX_TOKENS = 16
INPUT_NANOS, OUTPUT_NANOS = 250, 500  # $0.25 / $0.50 per 1M tokens: nano-dollars a token
# What one request costs upstream: 4,000 x 250 + 16 x 500 = 1,008,000 nano-dollars.
COST_NANOS = len(PROMPT) * INPUT_NANOS + MAX_TOKENS * OUTPUT_NANOS
BUDGET_USD, BUDGET_NANOS = 0.01, 10_000_000  # fits 9 such requests by what they cost
TPM = 40_000  # fits 9 such requests by what they use (4,016 tokens each)
CONCURRENT = 40


@pytest.fixture
def dense_gateway(
    clean_redis: str, provider: CountingProvider, tmp_path: Path
) -> Iterator[GatewayProcess]:
    policy = tmp_path / "routing_rules.yaml"
    policy.write_text(
        "providers:\n"
        f"  p: {{base_url: {provider.base_url}, timeout_s: 30}}\n"
        "models:\n"
        "  m-dense: {provider: p, upstream_model: dense-plain-chars,"
        " price: {input: 0.25, output: 0.5}}\n"
    )
    with metered_gateway(clean_redis, tmp_path / "gw", policy) as running:
        yield running


async def _fire(gateway: GatewayProcess, key: str, prefix: str) -> list[tuple[int, str | None]]:
    """``CONCURRENT`` dense chat requests at once; (status, error code) of each."""
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)

    async def one(index: int) -> tuple[int, str | None]:
        try:
            await client.chat.completions.create(
                model="m-dense",
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=MAX_TOKENS,
                user=f"{prefix}{index:03d}",
            )
            return 200, None
        except openai.APIStatusError as exc:
            return exc.status_code, exc.body.get("code") if isinstance(exc.body, dict) else None

    try:
        return await asyncio.gather(*(one(i) for i in range(CONCURRENT)))
    finally:
        await client.close()


def _billed(provider: CountingProvider, prefix: str) -> tuple[int, int, int]:
    """What the provider served under ``prefix``: (requests, tokens, nano-dollars)."""
    served = [s for tag, s in provider.snapshot().items() if tag.startswith(prefix)]
    tokens = sum(s.prompt + s.completion for s in served)
    nanos = sum(s.prompt * INPUT_NANOS + s.completion * OUTPUT_NANOS for s in served)
    return len(served), tokens, nanos


async def test_dense_prompts_stay_within_a_hard_budget_and_tpm(
    dense_gateway: GatewayProcess, provider: CountingProvider
) -> None:
    assert COST_NANOS == 1_008_000
    _, budget_key = dense_gateway.create_key(
        name="dense-budget", budget_usd=BUDGET_USD, budget_period="day"
    )
    outcomes = await _fire(dense_gateway, budget_key, "budget-")
    served, _, nanos = _billed(provider, "budget-")
    assert nanos <= BUDGET_NANOS, f"{served} served, {nanos} nano-dollars billed"
    assert served >= 1  # a bound, not a refusal of everything
    assert outcomes.count((200, None)) == served
    assert set(outcomes) - {(200, None)} == {(429, "insufficient_quota")}
    dense_gateway.wait_exported()
    usage = httpx.get(
        dense_gateway.url + "/v1/usage", headers={"Authorization": f"Bearer {budget_key}"}
    )
    assert usage.json()["total_cost_nanos"] == nanos == served * COST_NANOS

    _, tpm_key = dense_gateway.create_key(name="dense-tpm", tpm=TPM)
    outcomes = await _fire(dense_gateway, tpm_key, "tpm-")
    served, tokens, _ = _billed(provider, "tpm-")
    assert tokens <= TPM, f"{served} served, {tokens} tokens used in the window"
    assert served >= 1
    assert outcomes.count((200, None)) == served
    assert set(outcomes) - {(200, None)} == {(429, "rate_limit_exceeded")}
