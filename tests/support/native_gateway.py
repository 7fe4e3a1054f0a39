"""A gateway in front of the native upstreams (``native_upstreams``): one of each provider kind,
the policy that routes to them, and the provider keys in the environment.

``native_policy(fleet, checkpoint)`` writes a policy with models on OpenAI (which also serves
the Responses API natively), on the same upstream as a chat-only provider (so Responses
clients are translated), on Azure OpenAI (a deployment map), on Anthropic (prompt-caching
prices), on an engine fleet of one vLLM-like replica (``kind: engine_fleet``) and, when given
a checkpoint, on the in-process engine with a tiny random checkpoint. ``PRICES`` are the prices
each model has there, for tests that compute costs from the upstreams' books.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway_runner import RunningGateway
from native_anthropic import FakeAnthropic
from native_openai import FakeAzure, FakeEngineReplica, FakeOpenAI
from native_upstreams import NativeFleet

OPENAI_KEY = "sk-openai-upstream-0123456789"
AZURE_KEY = "azure-key-0123456789abcdef"
ANTHROPIC_KEY = "sk-ant-upstream-0123456789"
ENGINE_KEY = "engine-replica-key-0123456789"
AZURE_VERSION = "2024-10-21"
KEY_ENV = {
    "SY_TEST_OPENAI_KEY": OPENAI_KEY,
    "SY_TEST_AZURE_KEY": AZURE_KEY,
    "SY_TEST_ANTHROPIC_KEY": ANTHROPIC_KEY,
    "SY_TEST_ENGINE_KEY": ENGINE_KEY,
}

# USD per 1M tokens, exactly as in the policy below.
PRICES: dict[str, dict[str, float]] = {
    "gpt": {"input": 2.5, "output": 10, "cached_input": 1.25},
    "gpt-chat": {"input": 0.15, "output": 0.6, "cached_input": 0.075},
    "azure-gpt": {"input": 2.5, "output": 10},
    "claude": {"input": 3, "output": 15, "cached_input": 0.3, "cache_write_input": 3.75},
    "fleet-llama": {"input": 0.2, "output": 0.4},
    "tiny": {"input": 0.1, "output": 0.2},
}


@dataclass
class NativeGateway:
    """A running gateway in front of the native upstreams, and an API key for it."""

    gateway: RunningGateway
    fleet: NativeFleet
    key_id: str
    key: str


def native_fleet() -> NativeFleet:
    return NativeFleet(
        FakeOpenAI("openai", OPENAI_KEY),
        FakeAzure("azure", AZURE_KEY, AZURE_VERSION),
        FakeAnthropic("anthropic", ANTHROPIC_KEY),
        FakeEngineReplica("engine", ENGINE_KEY),
    )


def _price(model: str) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in PRICES[model].items()) + "}"


def native_policy(
    fleet: NativeFleet,
    checkpoint: Path | None = None,
    *,
    models: str = "",
    tail: str = "",
    native_batches: tuple[str, ...] = (),
) -> str:
    """The policy; ``models`` adds model entries (indented two spaces), ``tail`` top-level
    sections (tasks, fallbacks); the providers named in ``native_batches`` (``openai``,
    ``anthropic``) run batch lines through their own batch APIs (``batch: native``)."""
    local = ""
    local_model = ""
    if checkpoint is not None:
        local = f"""
  home:
    kind: local
    engine:
      model: {checkpoint}
      device: cpu
      max_num_seqs: 4
      max_num_batched_tokens: 512
      kv_cache_bytes: 67108864
"""
        local_model = f"""
  tiny:
    provider: home
    upstream_model: tiny-qwen3
    price: {_price("tiny")}
"""
    text = f"""
providers:
  openai:
    base_url: {fleet["openai"].url}
    api_key_env: SY_TEST_OPENAI_KEY
    formats: [openai_chat, openai_responses]
    forward_headers: [OpenAI-Organization, x-team-trace]
  openai-chat-only:
    base_url: {fleet["openai"].url}
    api_key_env: SY_TEST_OPENAI_KEY
  azure:
    kind: azure_openai
    base_url: {fleet["azure"].url}
    api_key_env: SY_TEST_AZURE_KEY
    api_version: "{AZURE_VERSION}"
    deployments:
      gpt-4o: prod-gpt4o
  anthropic:
    kind: anthropic
    base_url: {fleet["anthropic"].url}
    api_key_env: SY_TEST_ANTHROPIC_KEY
    forward_headers: [anthropic-beta]
  fleet:
    kind: engine_fleet
    api_key_env: SY_TEST_ENGINE_KEY
    fleet:
      replicas: [{fleet["engine"].replica}]
{local}
models:
  gpt:
    provider: openai
    upstream_model: gpt-4o
    price: {_price("gpt")}
  gpt-chat:
    provider: openai-chat-only
    upstream_model: gpt-4o-mini
    price: {_price("gpt-chat")}
  azure-gpt:
    provider: azure
    upstream_model: gpt-4o
    price: {_price("azure-gpt")}
  claude:
    provider: anthropic
    upstream_model: claude-sonnet-4
    price: {_price("claude")}
  fleet-llama:
    provider: fleet
    upstream_model: llama-3-8b
    price: {_price("fleet-llama")}
{local_model}{models}
{tail}
"""
    for name in native_batches:
        text = text.replace(f"\n  {name}:\n", f"\n  {name}:\n    batch: native\n", 1)
    return text


def cost_nanos(model: str, books: dict[str, int]) -> int:
    """The exact cost of a model's books at its policy prices (nano-dollars: USD/Mtok x 1000
    per token)."""
    price = PRICES[model]
    per_token = {name: round(value * 1000) for name, value in price.items()}
    cached = books.get("cached_tokens", 0)
    written = books.get("cache_write_tokens", 0)
    plain = books["prompt_tokens"] - cached - written
    return (
        plain * per_token["input"]
        + cached * per_token.get("cached_input", per_token["input"])
        + written * per_token.get("cache_write_input", per_token["input"])
        + books["completion_tokens"] * per_token["output"]
    )


def merged(*books: dict[str, Any]) -> dict[str, int]:
    total: dict[str, int] = {}
    for book in books:
        for name, value in book.items():
            total[name] = total.get(name, 0) + value
    return total
