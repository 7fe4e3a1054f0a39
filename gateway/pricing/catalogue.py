"""Prices of the models a policy prices not, from a maintained price catalogue.

The catalogue is ``genai-prices`` (Pydantic's): providers' published prices per model,
with prompt-cache reads and writes and tiered prices, as ``Decimal`` data inside the wheel, so
a price is found offline, the same on every replica, and changes only with the package's
version, which is recorded on every usage event costed from it (``price_catalogue``). Its
auto-update from the network is never used.

A model's catalogue entry is found by its provider kind (``anthropic``, ``azure_openai``,
``gemini``, ``vertex_ai``, ``bedrock``; an ``openai_compatible`` provider by its base URL, as
``genai-prices`` matches API URLs: a self-hosted server matches no provider) and its upstream
model name. The local engine and engine fleets are never priced from it.

Prices become the gateway's exact integers when the policy loads: USD per 1M tokens with at
most 3 decimals is a whole number of nano-dollars a token (``gateway/money.py``); a catalogue
price finer than that (Gemini 1.5 Flash's cache reads at $0.01875) is rounded *up* to the next
thousandth of a dollar per 1M tokens, never down, and ``switchyard policy prices`` shows both.
A tiered price (more past 200k prompt tokens) picks its tier by the request's prompt tokens,
as the provider bills.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal
from typing import Any

from gateway.money import price_to_nanos_per_token, tokens_cost_nanos

CATALOGUE_NAME = "genai-prices"
# Provider kind -> the catalogue's provider id (openai_compatible: matched by base URL).
CATALOGUE_PROVIDERS = {
    "anthropic": "anthropic",
    "azure_openai": "azure",
    "gemini": "google",
    "vertex_ai": "google",
    "bedrock": "aws",
}
# The catalogue's price fields -> the policy's price fields.
_FIELDS = {
    "input_mtok": "input",
    "output_mtok": "output",
    "cache_read_mtok": "cached_input",
    "cache_write_mtok": "cache_write_input",
}
_THOUSANDTH = Decimal("0.001")


@dataclass(frozen=True)
class TierPrice:
    """One tier's prices in USD per 1M tokens, as the gateway costs them (whole nano-dollars
    a token); a cache price the catalogue has not is the input price, as in a policy."""

    input: Decimal
    output: Decimal
    cached_input: Decimal
    cache_write_input: Decimal

    @property
    def rates(self) -> tuple[int, int, int, int]:
        """Nano-dollars a token: input, output, cache reads, cache writes."""
        return (
            price_to_nanos_per_token(self.input),
            price_to_nanos_per_token(self.output),
            price_to_nanos_per_token(self.cached_input),
            price_to_nanos_per_token(self.cache_write_input),
        )

    @property
    def highest_per_mtok(self) -> float:
        return float(max(self.input, self.output))


@dataclass(frozen=True)
class CataloguePrice:
    """A catalogue entry as the gateway costs it: a price per tier, the first from 0 prompt
    tokens, each next one for requests of more prompt tokens than its threshold."""

    tiers: tuple[tuple[int, TierPrice], ...]
    version: str  # "genai-prices 0.2.3": what the usage events record
    model_id: str  # the catalogue's name of the model
    exact: dict[str, str]  # the catalogue's own prices (first tier), as Decimal text

    def tier(self, prompt_tokens: int) -> TierPrice:
        chosen = self.tiers[0][1]
        for threshold, price in self.tiers[1:]:
            if prompt_tokens > threshold:
                chosen = price
        return chosen

    def cost_nanos(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> int:
        return tokens_cost_nanos(
            self.tier(prompt_tokens).rates,
            prompt_tokens,
            completion_tokens,
            cached_tokens,
            cache_write_tokens,
        )

    @property
    def highest_per_mtok(self) -> float:
        """The first tier's (what a request within it costs)."""
        return self.tiers[0][1].highest_per_mtok


class PriceCatalogue:
    """The bundled price data of the installed ``genai-prices``."""

    def __init__(self) -> None:
        from importlib.metadata import version

        from genai_prices import data_snapshot

        self.version = f"{CATALOGUE_NAME} {version('genai-prices')}"
        self._snapshot = data_snapshot.get_snapshot()

    def lookup(self, kind: str, api_url: str | None, model: str) -> CataloguePrice | None:
        """The price of ``model`` at a provider of ``kind`` (an ``openai_compatible`` one by
        its ``api_url``), or None when the catalogue has no such provider or model."""
        provider_id = CATALOGUE_PROVIDERS.get(kind)
        if provider_id is None and api_url is None:
            return None
        try:
            _, info = self._snapshot.find_provider_model(model, None, provider_id, api_url)
        except LookupError:
            return None
        prices = info.get_prices(datetime.now(UTC))
        values = {name: getattr(prices, field, None) for field, name in _FIELDS.items()}
        if values["input"] is None and values["output"] is None:
            return None  # priced by other units only (images, requests)
        thresholds = sorted(
            {tier.start for value in values.values() for tier in getattr(value, "tiers", ())}
        )
        tiers = tuple((start, _tier_price(values, start)) for start in (0, *thresholds))
        exact = {name: str(_at(value, 0)) for name, value in values.items() if value is not None}
        return CataloguePrice(tiers, self.version, info.id, exact)


def _at(value: Any, prompt_tokens: int) -> Decimal | None:
    """A catalogue price (plain or tiered) for requests past ``prompt_tokens`` (a tier's
    threshold; 0 for the first tier)."""
    if value is None or isinstance(value, Decimal):
        return value
    chosen = value.base
    for tier in value.tiers:
        if 0 < tier.start <= prompt_tokens:
            chosen = tier.price
    return chosen


def _tier_price(values: dict[str, Any], start: int) -> TierPrice:
    """The prices of one tier, each rounded up to a whole nano-dollar a token."""

    def rounded(name: str, fallback: Decimal) -> Decimal:
        value = _at(values[name], start)
        exact = fallback if value is None else value
        return exact.quantize(_THOUSANDTH, rounding=ROUND_CEILING).normalize()

    zero = Decimal(0)
    base = rounded("input", zero)
    return TierPrice(
        input=base,
        output=rounded("output", zero),
        cached_input=rounded("cached_input", base),
        cache_write_input=rounded("cache_write_input", base),
    )


@functools.cache
def bundled_catalogue() -> PriceCatalogue:
    """The catalogue, loaded once per process (its data is the installed package's and
    never changes while the process runs): about half a second, on the first policy that
    leaves a model unpriced."""
    return PriceCatalogue()
