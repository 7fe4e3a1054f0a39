"""The ``models:`` section: each model's provider, price, context window, capabilities, cache
and sampling defaults."""

from __future__ import annotations

import functools
from typing import Any

from pydantic import Field, PrivateAttr, field_validator

from gateway.money import MAX_PRICE_PER_MTOK, price_to_nanos_per_token, tokens_cost_nanos
from gateway.policy.base import StrictModel
from gateway.policy.cache import CachePolicy


class Price(StrictModel):
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

    @functools.cached_property
    def rates(self) -> tuple[int, int, int, int]:
        """Nano-dollars a token for input, output, cache reads and cache writes, read exactly
        from the decimal text once. (Not private attributes: pydantic reads those through
        ``__getattr__``, about 1 µs each, and every request is costed twice.) Cached in the
        instance: ``model_copy(update=...)`` of a price would keep it; prices are never
        copied, only loaded."""
        cached = self.input if self.cached_input is None else self.cached_input
        written = self.input if self.cache_write_input is None else self.cache_write_input
        return (
            price_to_nanos_per_token(self.input),
            price_to_nanos_per_token(self.output),
            price_to_nanos_per_token(cached),
            price_to_nanos_per_token(written),
        )

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
        return tokens_cost_nanos(
            self.rates, prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens
        )

    @property
    def highest_per_mtok(self) -> float:
        return max(self.input, self.output)


class ModelDefaults(StrictModel):
    """Sampling values the gateway sends upstream for a request that sets none of them, in
    the request's format (``max_tokens`` is ``max_output_tokens`` on the Responses API)."""

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)


class ModelConfig(StrictModel):
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
    # Without a ``price:``, the price catalogue's (gateway/pricing), set when the policy loads.
    _catalogue: Any = PrivateAttr(default=None)

    def set_catalogue_price(self, price: Any) -> None:
        self._catalogue = price
        for derived in ("pricing", "price_catalogue"):  # read before: stale now
            self.__dict__.pop(derived, None)

    # Cached in the instance: the private attribute is read through pydantic's ``__getattr__``,
    # about 1.8 µs a read, and every request reads these three times (costed twice, recorded).
    @functools.cached_property
    def pricing(self) -> Any:
        """What this model is costed at: its ``price:``, else the catalogue's (a
        ``CataloguePrice``), else the zero price. Both have ``cost_nanos``."""
        catalogue = self._catalogue
        return catalogue if catalogue is not None else self.price

    @functools.cached_property
    def price_catalogue(self) -> str:
        """The catalogue version its price comes from ("" when the policy's own)."""
        catalogue = self._catalogue
        return catalogue.version if catalogue is not None else ""
