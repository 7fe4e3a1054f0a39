"""What the prompt token estimates cost per request, on request bodies of typical shapes.

``python -m bench.estimate [--repeat N]``: for each body, the microseconds of
``estimate_prompt_tokens`` (the typical estimate routing reads) and ``prompt_token_bound`` (the
reservation's upper bound), CPU time, best of seven rounds, and both figures.
"""

from __future__ import annotations

import argparse
import base64
from functools import partial
from typing import Any

from bench.machine import cpu_model, cpu_us_per_call
from gateway.routing.estimate import estimate_prompt_tokens, prompt_token_bound


def bodies() -> dict[str, dict[str, Any]]:
    """Request bodies of the shapes clients send."""
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "lorem ipsum dolor " * 90}
        for i in range(10)
    ]
    tool = {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the catalogue by free text and filters.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer", "minimum": 1},
                    "filters": {"type": "object", "additionalProperties": {"type": "string"}},
                },
                "required": ["query"],
            },
        },
    }
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    image = "data:image/png;base64," + base64.b64encode(bytes(100_000)).decode()
    return {
        "short chat (2 messages, 200 chars)": {
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is the capital of France? " * 6},
            ]
        },
        "long chat (10 turns, 16 KB)": {"messages": turns},
        "CJK (4,000 x 漢)": {"messages": [{"role": "user", "content": "漢" * 4000}]},
        "tools (8 schemas, a call and its result)": {
            "messages": [
                {"role": "user", "content": "find me shoes"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "[]" * 200},
            ],
            "tools": [tool] * 8,
        },
        "image (100 KB base64) and text": {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "describe"},
                        {"type": "image_url", "image_url": {"url": image}},
                    ],
                }
            ]
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000, help="calls per round")
    args = parser.parse_args(argv)
    print(f"CPU: {cpu_model()}; CPU time per call, best of 7 rounds of {args.repeat}")
    print(f"{'body':44} {'typical µs':>10} {'bound µs':>9} {'typical':>8} {'bound':>8}")
    for name, body in bodies().items():
        typical = cpu_us_per_call(partial(estimate_prompt_tokens, body), args.repeat)
        bound = cpu_us_per_call(partial(prompt_token_bound, body), args.repeat)
        print(
            f"{name:44} {typical:10.2f} {bound:9.2f} "
            f"{estimate_prompt_tokens(body):8d} {prompt_token_bound(body):8d}"
        )


if __name__ == "__main__":
    main()
