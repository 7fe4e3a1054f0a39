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


RESPONSES_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather now.",
    "parameters": WEATHER_PARAMETERS,
    "strict": True,
}


def responses_round_trip(client: Any, model: str, call_tokens: int, **sampling: Any) -> None:
    """Responses API: a required ``function_call`` that validates, then its
    ``function_call_output`` and a final text answer with no call in it."""
    args = dict(model=model, tools=[RESPONSES_TOOL], **sampling)
    response = client.responses.create(
        **args,
        input=ASK[0]["content"],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=call_tokens,
    )
    (item,) = [item for item in response.output if item.type == "function_call"]
    check_call(item.name, item.arguments, only="get_weather")
    final = client.responses.create(
        **args,
        input=[
            {"role": "user", "content": ASK[0]["content"]},
            {
                "type": "function_call",
                "call_id": item.call_id,
                "name": item.name,
                "arguments": item.arguments,
            },
            {"type": "function_call_output", "call_id": item.call_id, "output": "21 C"},
        ],
        tool_choice="none",
        max_output_tokens=48,
    )
    assert final.output_text
    assert not [item for item in final.output if item.type == "function_call"]
