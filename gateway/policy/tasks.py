"""The ``tasks:`` section: a workload's candidate models, how to choose among them, and its
constraints and fallbacks."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.policy.base import StrictModel
from gateway.policy.cache import CachePolicy

Strategy = Literal["ordered", "cheapest", "lowest_latency", "weighted"]


class TaskConfig(StrictModel):
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
