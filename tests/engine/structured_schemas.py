"""Seeded random JSON schemas for the structured-output tests: nested objects, arrays, enums,
required and optional fields, integers and numbers with bounds. Every leaf is bounded (string
lengths, array sizes, number ranges), so each schema's language is finite and even a
random-weight model reaches its end within a few hundred tokens."""

from __future__ import annotations

import random
from typing import Any

WORDS = ["red", "green", "blue", "alpha", "beta", "north", "south", "on", "off", "x1", "y2"]


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """An object schema (the root of a response_format is always an object)."""
    count = rng.randint(1, 4 if depth == 0 else 3)
    names = rng.sample(
        ["id", "name", "size", "kind", "tags", "meta", "score", "ok", "items"], count
    )
    properties = {name: _value(rng, depth + 1) for name in names}
    required = [name for name in names if rng.random() < 0.7]
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = required
    return schema


def _value(rng: random.Random, depth: int) -> dict[str, Any]:
    kinds = ["string", "integer", "number", "boolean", "enum"]
    if depth < 3:
        kinds += ["object", "array"]
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "minLength": 1, "maxLength": rng.randint(1, 5)}
    if kind == "integer":
        low = rng.randint(-100, 100)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 500)}
    if kind == "number":
        low = rng.randint(-10, 10)
        return {"type": "number", "minimum": low, "maximum": low + rng.randint(1, 50)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(WORDS, rng.randint(1, 4))}
    if kind == "object":
        return random_schema(rng, depth)
    return {
        "type": "array",
        "items": _value(rng, depth + 1),
        "minItems": rng.randint(0, 1),
        "maxItems": rng.randint(1, 3),
    }
