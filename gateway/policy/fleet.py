"""An ``engine_fleet`` provider's ``fleet:`` block: its replicas and how to route over them."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from gateway.policy.base import StrictModel


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


class FleetScrape(StrictModel):
    """How a fleet reads each replica's Prometheus metrics (its queue and KV cache use)."""

    interval_ms: int = Field(default=250, ge=10, le=60_000)
    timeout_s: float = Field(default=1.0, gt=0, le=60)
    metrics_path: str = Field(default="/metrics", pattern=r"^/[^?#\s]*$")
    model_name: str | None = Field(
        default=None, description="read only series with this model_name label (vLLM's)"
    )


class FleetPrefix(StrictModel):
    """The prompt prefix that affinity hashes: its first ``blocks`` blocks."""

    blocks: int = Field(default=8, ge=1, le=256)
    block_chars: int = Field(default=256, ge=1, le=1_000_000)
    block_tokens: int = Field(default=64, ge=1, le=100_000)
    tokenizer: str | None = Field(
        default=None,
        description="the replicas' tokenizer.json: blocks are then counted in tokens "
        "(needs the tokenizers package); unset = in characters",
    )


class FleetConfig(StrictModel):
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
