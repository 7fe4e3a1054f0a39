"""A gateway in front of the cloud upstreams (``native_gemini``, ``native_bedrock``): the Gemini
API, Vertex AI (Gemini and Claude, with its OAuth token endpoint) and Bedrock Runtime, the
policy that routes to them, and their credentials in the environment.

``CloudUpstreams`` starts the fakes and writes the test service-account key file (its
``token_uri`` on the fake Vertex). ``cloud_env`` is the environment of a gateway: the Gemini key,
AWS credentials in the variables of AWS's chain (and no shared files or instance metadata to
find others in). ``cloud_policy`` has one model per kind with a price, a Bedrock model that is
throttled and falls back to the priced Bedrock model, and ``gemini-catalogue``: a Gemini model
with no price, costed from the price catalogue.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

from native_bedrock import FakeBedrock
from native_gemini import FakeGemini, FakeVertex, service_account_json, service_account_key
from native_upstreams import NativeFleet

GEMINI_KEY = "AIzaSy-test-gemini-key-0123456789"
AWS_ACCESS_KEY = "AKIASWITCHYARDTEST01"
AWS_SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYSWITCHYARD"
AWS_REGION = "us-east-1"
VERTEX_PROJECT = "switchyard-test"
VERTEX_LOCATION = "us-central1"
BEDROCK_CLAUDE = "anthropic.claude-3-haiku-20240307-v1:0"
CATALOGUE_MODEL = "gemini-2.5-flash"

# USD per 1M tokens, exactly as in the policy below.
CLOUD_PRICES: dict[str, dict[str, str]] = {
    "gemini-flash": {"input": "0.3", "output": "2.5", "cached_input": "0.075"},
    "vertex-gemini": {"input": "1.25", "output": "10", "cached_input": "0.31"},
    "vertex-claude": {
        "input": "3",
        "output": "15",
        "cached_input": "0.3",
        "cache_write_input": "3.75",
    },
    "bedrock-claude": {
        "input": "0.25",
        "output": "1.25",
        "cached_input": "0.025",
        "cache_write_input": "0.3",
    },
}
# model -> (fake, the upstream model the fake books it under)
CLOUD_MODELS: dict[str, tuple[str, str]] = {
    "gemini-flash": ("gemini", "gemini-2.5-flash"),
    "vertex-gemini": ("vertex", "gemini-2.5-pro"),
    "vertex-claude": ("vertex", "claude-sonnet-4@20250514"),
    "bedrock-claude": ("bedrock", BEDROCK_CLAUDE),
}


class CloudUpstreams(NativeFleet):
    """The three cloud fakes on one background loop, and the service-account key file."""

    def __init__(self, root: Path) -> None:
        self.key = service_account_key()
        super().__init__(
            FakeGemini("gemini", GEMINI_KEY),
            FakeVertex("vertex", self.key),
            FakeBedrock("bedrock", AWS_ACCESS_KEY, AWS_SECRET_KEY, AWS_REGION),
        )
        self.key_file = root / "service-account.json"

    def __enter__(self) -> CloudUpstreams:
        super().__enter__()
        account = service_account_json(self.key, self["vertex"].token_uri)
        self.key_file.write_text(json.dumps(account))
        return self


def cloud_env(root: Path) -> dict[str, str]:
    """The gateway's environment: the Gemini key and AWS's chain pointed at the test keys."""
    return {
        "SY_TEST_GEMINI_KEY": GEMINI_KEY,
        "AWS_ACCESS_KEY_ID": AWS_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET_KEY,
        "AWS_CONFIG_FILE": str(root / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(root / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def _price(model: str) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in CLOUD_PRICES[model].items()) + "}"


def cloud_policy(fleet: CloudUpstreams) -> str:
    return f"""
providers:
  gemini:
    kind: gemini
    base_url: {fleet["gemini"].url}
    api_key_env: SY_TEST_GEMINI_KEY
  vertex:
    kind: vertex_ai
    base_url: {fleet["vertex"].url}
    vertex:
      project: {VERTEX_PROJECT}
      location: {VERTEX_LOCATION}
      credentials_file: {fleet.key_file}
  vertex-claude:
    kind: vertex_ai
    base_url: {fleet["vertex"].url}
    default_max_tokens: 512
    vertex:
      project: {VERTEX_PROJECT}
      location: {VERTEX_LOCATION}
      publisher: anthropic
      credentials_file: {fleet.key_file}
  bedrock:
    kind: bedrock
    base_url: {fleet["bedrock"].url}
    bedrock:
      region: {AWS_REGION}
models:
  gemini-flash:
    provider: gemini
    upstream_model: gemini-2.5-flash
    price: {_price("gemini-flash")}
  gemini-catalogue:
    provider: gemini
    upstream_model: {CATALOGUE_MODEL}
  vertex-gemini:
    provider: vertex
    upstream_model: gemini-2.5-pro
    price: {_price("vertex-gemini")}
  vertex-claude:
    provider: vertex-claude
    upstream_model: claude-sonnet-4@20250514
    price: {_price("vertex-claude")}
  bedrock-claude:
    provider: bedrock
    upstream_model: "{BEDROCK_CLAUDE}"
    price: {_price("bedrock-claude")}
  bedrock-throttled:
    provider: bedrock
    upstream_model: throttled-model
    price: {_price("bedrock-claude")}
  gemini-embed:
    provider: gemini
    upstream_model: text-embedding-004
    capabilities: [embeddings]
    price: {{input: 0.15}}
  vertex-embed:
    provider: vertex
    upstream_model: text-embedding-005
    capabilities: [embeddings]
    price: {{input: 0.025}}
  bedrock-titan:
    provider: bedrock
    upstream_model: "amazon.titan-embed-text-v2:0"
    capabilities: [embeddings]
    price: {{input: 0.02}}
  bedrock-cohere:
    provider: bedrock
    upstream_model: cohere.embed-english-v3
    capabilities: [embeddings]
    price: {{input: 0.1}}
fallbacks:
  bedrock-throttled: [bedrock-claude]
"""


def price_cost(price: dict[str, Any], books: dict[str, int]) -> int:
    """The exact cost of a model's books at USD-per-Mtok prices (Decimal text), in nano-dollars,
    rounded up once per token price to a whole nano-dollar as the gateway reads prices."""

    def per_token(name: str, fallback: str = "input") -> int:
        value = Decimal(str(price.get(name, price[fallback]))) * 1000
        return int(value.to_integral_value(rounding="ROUND_CEILING"))

    cached = books.get("cached_tokens", 0)
    written = books.get("cache_write_tokens", 0)
    plain = books["prompt_tokens"] - cached - written
    return (
        plain * per_token("input")
        + cached * per_token("cached_input")
        + written * per_token("cache_write_input")
        + books["completion_tokens"] * per_token("output", "output")
    )
