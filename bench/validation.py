"""``python -m bench.validation``: CPU cost of checking one /v1 chat body, per request.

Times (best of ``--repeat`` timeit runs, µs per call) on three realistic bodies (a small chat,
a chat with tools, tool calls and a JSON-schema response format, and a 50-message chat):

- ``strict JSON``: ``parse_json_object`` (orjson, depth cap, duplicate-key check);
- ``msgspec``: the gateway's typed check (``api.validation.validate_chat``);
- ``pydantic``: the same models written for pydantic v2 (below), the alternative measured.

It also times what the exchange middleware (``server/exchange.py``, the status the client got)
adds to one request: an ASGI call through it against the same call without it. With
``--before DIR`` (the ``gateway/api`` folder of an older tree, e.g. from ``git archive``) it
times that tree's ``parse_json_object`` + ``validate_chat`` against this one's, interleaved.

This is how the validator was chosen; docs/benchmarks.md records a run. Timings only: it
starts no server and is safe to run on a busy machine (expect noise, not bias).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import time
import timeit
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from gateway.api.strict_json import parse_json_object
from gateway.api.v1.validation import validate_chat
from gateway.server.exchange import ExchangeMiddleware

# -- the pydantic v2 mirror of api/v1/request_models.py (chat only), for comparison ---------------


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class _Part(_Model):
    type: str
    text: str | None = None


_Content = str | list[_Part]


class _FunctionCall(_Model):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(_Model):
    type: str | None = None
    function: _FunctionCall | None = None


class _NeedsContent(_Model):
    role: Literal["system", "developer", "user"]
    content: _Content
    name: str | None = None


class _Assistant(_Model):
    role: Literal["assistant"]
    content: _Content | None = None
    name: str | None = None
    tool_calls: list[_ToolCall] | None = None
    function_call: _FunctionCall | None = None


class _ToolOrFunction(_Model):
    role: Literal["tool", "function"]
    content: _Content | None = None
    name: str | None = None


_Message = Annotated[_NeedsContent | _Assistant | _ToolOrFunction, Field(discriminator="role")]


class _FunctionDefinition(_Model):
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class _Tool(_Model):
    type: Annotated[str, Field(min_length=1)]
    function: _FunctionDefinition | None = None


class _JsonSchemaFormat(_Model):
    name: Annotated[str, Field(min_length=1)]
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class _ResponseFormat(_Model):
    type: Annotated[str, Field(min_length=1)]
    json_schema: _JsonSchemaFormat | None = None


class _StreamOptions(_Model):
    include_usage: bool | None = None


class _Metadata(_Model):
    task_type: str | None = None


_Choices = Annotated[int, Field(ge=1, le=128)]
_TokenCap = Annotated[int, Field(ge=1, le=10_000_000)]


class PydanticChatRequest(_Model):
    model: Annotated[str, Field(min_length=1)] | None = None
    messages: Annotated[list[_Message], Field(min_length=1)]
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    n: _Choices | None = None
    best_of: _Choices | None = None
    max_tokens: _TokenCap | None = None
    max_completion_tokens: _TokenCap | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    stop: str | list[str] | None = None
    user: str | None = None
    metadata: _Metadata | None = None
    tools: list[_Tool] | None = None
    functions: list[_FunctionDefinition] | None = None
    response_format: _ResponseFormat | None = None


# -- the bodies ------------------------------------------------------------------------------


def _function(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": [next(iter(properties))]}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


SMALL_CHAT: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hi in five words."},
    ],
    "max_tokens": 32,
    "temperature": 0.2,
}
TOOLS_CHAT: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, clear"},
    ],
    "tools": [
        _function(
            "get_weather",
            "Current weather for a city",
            {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        ),
        _function(
            "search",
            "Web search",
            {"q": {"type": "string"}, "k": {"type": "integer", "minimum": 1, "maximum": 10}},
        ),
    ],
    "tool_choice": "auto",
    "response_format": {
        "type": "json_schema",
        "json_schema": {
            "name": "answer",
            "schema": {"type": "object", "properties": {"text": {"type": "string"}}},
            "strict": True,
        },
    },
    "stream": True,
    "stream_options": {"include_usage": True},
    "metadata": {"task_type": "chat"},
    "user": "user-42",
}
LONG_CHAT: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "system", "content": "Be helpful."}]
    + [
        {
            "role": "user" if turn % 2 else "assistant",
            "content": f"Turn {turn}: a sentence or two about the topic at hand, as people write.",
        }
        for turn in range(49)
    ],
    "max_tokens": 256,
}
BODIES = {"small chat": SMALL_CHAT, "chat with tools": TOOLS_CHAT, "50-message chat": LONG_CHAT}


def per_call_us(function: Callable[[], object], number: int, repeat: int) -> float:
    return min(timeit.repeat(function, number=number, repeat=repeat)) / number * 1e6


def measure(number: int, repeat: int) -> list[dict[str, Any]]:
    rows = []
    for name, body in BODIES.items():
        raw = orjson.dumps(body)
        validate_chat(body)  # both accept every body: a like-for-like comparison
        PydanticChatRequest.model_validate(body)
        rows.append(
            {
                "body": name,
                "bytes": len(raw),
                "strict_json_us": per_call_us(partial(parse_json_object, raw), number, repeat),
                "msgspec_us": per_call_us(partial(validate_chat, body), number, repeat),
                "pydantic_us": per_call_us(
                    partial(PydanticChatRequest.model_validate, body), number, repeat
                ),
            }
        )
    return rows


async def _answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def _discard(message: dict[str, Any]) -> None:
    return None


async def _calls_us(app: Any, number: int) -> float:
    template = {"type": "http", "path": "/v1/chat/completions", "headers": [], "method": "POST"}
    started = time.perf_counter()
    for _ in range(number):
        await app(dict(template), None, _discard)
    return (time.perf_counter() - started) / number * 1e6


def middleware_cost_us(number: int, repeat: int) -> float:
    """µs the exchange middleware adds to one answered request (best of ``repeat``)."""
    wrapped = ExchangeMiddleware(_answer)
    best = float("inf")
    for _ in range(repeat):
        plain = asyncio.run(_calls_us(_answer, number))
        through = asyncio.run(_calls_us(wrapped, number))
        best = min(best, through - plain)
    return best


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def before_after(api_dir: Path, number: int, repeat: int) -> list[tuple[str, float, float]]:
    """(body, µs before, µs after) for strict JSON + chat validation, old tree vs this one."""
    old_json = _load(api_dir / "strict_json.py", "before_strict_json")
    old_validation = _load(api_dir / "validation.py", "before_validation")
    rows = []
    for name, body in BODIES.items():
        raw = orjson.dumps(body)

        def before(raw: bytes = raw) -> None:
            old_validation.validate_chat(old_json.parse_json_object(raw))

        def after(raw: bytes = raw) -> None:
            validate_chat(parse_json_object(raw))

        old_us, new_us = float("inf"), float("inf")
        for _ in range(repeat):  # interleaved, so load on the machine hits both alike
            old_us = min(old_us, per_call_us(before, number, 1))
            new_us = min(new_us, per_call_us(after, number, 1))
        rows.append((name, old_us, new_us))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.validation")
    parser.add_argument("--number", type=int, default=20_000, help="calls per timeit run")
    parser.add_argument("--repeat", type=int, default=5, help="timeit runs; the best is shown")
    parser.add_argument(
        "--before", type=Path, help="an older tree's gateway/api folder to compare against"
    )
    args = parser.parse_args(argv)
    print("| body | bytes | strict JSON µs | msgspec µs | pydantic v2 µs | pydantic / msgspec |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in measure(args.number, args.repeat):
        ratio = row["pydantic_us"] / row["msgspec_us"]
        print(
            f"| {row['body']} | {row['bytes']} | {row['strict_json_us']:.2f} "
            f"| {row['msgspec_us']:.2f} | {row['pydantic_us']:.2f} | {ratio:.1f}x |"
        )
    added = middleware_cost_us(args.number, args.repeat)
    print(f"\nexchange middleware: +{added:.2f} µs per request")
    if args.before is not None:
        print("\n| body | before: parse + check µs | after: parse + check µs | change µs |")
        print("|---|---:|---:|---:|")
        for name, old_us, new_us in before_after(args.before, args.number, args.repeat):
            print(f"| {name} | {old_us:.2f} | {new_us:.2f} | {new_us - old_us:+.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
