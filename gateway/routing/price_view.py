"""What a model is costed at and where that price comes from, as ``switchyard policy prices``
and ``/admin/route/explain`` show it.

``price_view(config)`` is the price of one policy model: USD per 1M tokens (as the gateway
counts them: whole nano-dollars a token) for input, output, cache reads and cache writes, and
its ``source``: ``policy`` (its own ``price:``), the catalogue's version (``genai-prices
0.2.3``, with the catalogue's name of the model, its higher tiers and any price rounded up to
a whole nano-dollar a token), or ``none`` (neither: it costs nothing).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from gateway.money import exact_decimal
from gateway.policy import ModelConfig, Policy, Price
from gateway.pricing.catalogue import TierPrice

FIELDS = ("input", "output", "cached_input", "cache_write_input")


def _per_mtok(price: Price | TierPrice) -> dict[str, str]:
    """Each field as decimal text, unset cache prices as the input price they fall back to."""
    if isinstance(price, TierPrice):
        return {name: _text(getattr(price, name)) for name in FIELDS}
    values = {
        "input": price.input,
        "output": price.output,
        "cached_input": price.input if price.cached_input is None else price.cached_input,
        "cache_write_input": (
            price.input if price.cache_write_input is None else price.cache_write_input
        ),
    }
    return {name: _text(exact_decimal(value)) for name, value in values.items()}


def _text(value: Decimal) -> str:
    text = format(value.normalize(), "f")
    return text


def price_view(config: ModelConfig) -> dict[str, Any]:
    pricing = config.pricing
    if config.price_catalogue:
        view: dict[str, Any] = {**_per_mtok(pricing.tiers[0][1]), "source": config.price_catalogue}
        view["catalogue_model"] = pricing.model_id
        if len(pricing.tiers) > 1:
            view["tiers"] = [
                {"above_prompt_tokens": threshold, **_per_mtok(price)}
                for threshold, price in pricing.tiers[1:]
            ]
        rounded = {
            name: exact
            for name, exact in pricing.exact.items()
            if exact_decimal(exact) != exact_decimal(view[name])
        }
        if rounded:
            view["rounded_up_from"] = rounded
        return view
    source = "policy" if "price" in config.model_fields_set else "none"
    return {**_per_mtok(config.price), "source": source}


def price_table(policy: Policy) -> list[dict[str, Any]]:
    """One row per model, in the policy's order."""
    return [
        {
            "model": name,
            "provider": config.provider,
            "upstream_model": policy.upstream_model(name),
            **price_view(config),
        }
        for name, config in policy.models.items()
    ]
