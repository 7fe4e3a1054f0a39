"""Function tools for the local-engine tool-calling tests, and the check every call must pass.

The schemas are bounded (short strings, small integers, enums, no extra keys): a random-weight
model walks a grammar at random, so a bound is what lets it reach the end of a call in few
tokens. The grammar guarantees the rest: the name of an offered function, and arguments
that validate against its parameters.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema

WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 8},
        "unit": {"type": "string", "enum": ["c", "f"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 99},
        "b": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
PARAMETERS = {"get_weather": WEATHER_PARAMETERS, "add": ADD_PARAMETERS}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city now.",
            "parameters": WEATHER_PARAMETERS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "The sum of two numbers.",
            "parameters": ADD_PARAMETERS,
        },
    },
]
ASK = [{"role": "user", "content": "What is the weather in Paris? Use a tool."}]


def check_call(name: str, arguments: str | dict[str, Any], only: str | None = None) -> Any:
    """The call names an offered function (``only`` if given) and its arguments validate."""
    assert name in PARAMETERS, name
    if only is not None:
        assert name == only
    parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(parsed, PARAMETERS[name])
    return parsed
