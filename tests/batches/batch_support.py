"""What the batch tests share: models with batch prices on the native upstreams, their exact
cost from an upstream's books, JSONL input, and waiting for a batch to end."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

# USD per 1M tokens, as in BATCH_MODELS; each with its batch price (half, as OpenAI's and
# Anthropic's batch discounts are).
BATCH_PRICES: dict[str, dict[str, Any]] = {
    "gpt-b": {
        "input": 2.5,
        "output": 10,
        "cached_input": 1.25,
        "batch": {"input": 1.25, "output": 5, "cached_input": 0.625},
    },
    "claude-b": {
        "input": 3,
        "output": 15,
        "cached_input": 0.3,
        "cache_write_input": 3.75,
        "batch": {"input": 1.5, "output": 7.5, "cached_input": 0.15, "cache_write_input": 1.875},
    },
}


def _flow(price: dict[str, Any]) -> str:
    return (
        "{"
        + ", ".join(
            f"{name}: {_flow(value) if isinstance(value, dict) else value}"
            for name, value in price.items()
        )
        + "}"
    )


# Models for native_policy(models=...): gpt-b on OpenAI, gpt-b-filtered on OpenAI too (its
# upstream refuses every request: content filter), claude-b on Anthropic.
BATCH_MODELS = f"""
  gpt-b:
    provider: openai
    upstream_model: gpt-4o
    price: {_flow(BATCH_PRICES["gpt-b"])}
  gpt-b-filtered:
    provider: openai
    upstream_model: gpt-4o-filtered
    price: {_flow(BATCH_PRICES["gpt-b"])}
  claude-b:
    provider: anthropic
    upstream_model: claude-sonnet-4
    price: {_flow(BATCH_PRICES["claude-b"])}
"""


def batch_cost_nanos(model: str, books: dict[str, int]) -> int:
    """A model's books at its batch price, exactly (USD/Mtok x 1000 = nano-dollars a token)."""
    price = {name: round(value * 1000) for name, value in BATCH_PRICES[model]["batch"].items()}
    cached = books.get("cached_tokens", 0)
    written = books.get("cache_write_tokens", 0)
    plain = books["prompt_tokens"] - cached - written
    return (
        plain * price["input"]
        + cached * price.get("cached_input", price["input"])
        + written * price.get("cache_write_input", price["input"])
        + books["completion_tokens"] * price["output"]
    )


def model_of(index: int) -> str:
    """Line ``index``'s model: a quarter refused upstream, a quarter OpenAI, half Anthropic."""
    return ("gpt-b-filtered", "gpt-b", "claude-b", "claude-b")[index % 4]


def chat_jsonl(count: int, model: Callable[[int], str] = model_of) -> bytes:
    lines = [
        {
            "custom_id": f"line-{index}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": model(index),
                "max_tokens": 16,
                "messages": [{"role": "user", "content": f"question {index}"}],
            },
        }
        for index in range(count)
    ]
    return b"\n".join(orjson.dumps(line) for line in lines) + b"\n"


def wait_until(done: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``done`` until it returns something true; its value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = done()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def jsonl(text: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def check_chat_lines(
    output: list[dict[str, Any]], errors: list[dict[str, Any]], count: int
) -> None:
    """The output and error files of a batch of ``chat_jsonl(count)``: exactly one line per
    ``custom_id``; each answer the upstream's to its own question, each refusal the content
    filter's of a ``gpt-b-filtered`` line."""
    ids = [line["custom_id"] for line in output + errors]
    assert len(ids) == len(set(ids)) == count
    for line in output:
        index = int(line["custom_id"].split("-")[1])
        assert model_of(index) != "gpt-b-filtered" and line["error"] is None
        response = line["response"]
        assert response["status_code"] == 200 and response["request_id"] == line["id"]
        text = response["body"]["choices"][0]["message"]["content"]
        assert text.endswith(f"question {index}")
    for line in errors:
        assert model_of(int(line["custom_id"].split("-")[1])) == "gpt-b-filtered"
        assert line["response"]["status_code"] == 400
        assert line["response"]["body"]["error"]["code"] == "content_filter"


def batch_usage_row(gateway: Any, batch_id: str) -> dict[str, Any]:
    """The batch's row of ``GET /admin/usage?group_by=batch``, once every event is exported."""
    gateway.wait_exported()
    with gateway.admin() as admin:
        report = admin.get("/admin/usage", params={"group_by": "batch"}).json()
    (row,) = [row for row in report["data"] if row["batch"] == batch_id]
    return row


def check_batch_usage(row: dict[str, Any], count: int, books: dict[str, dict[str, int]]) -> None:
    """A batch of ``count`` lines, a quarter refused upstream, recorded as the upstreams'
    ``books`` (gateway model -> the books of its upstream model) say: to the token, and at
    the batch price to the nano-dollar."""
    assert row["requests"] == count and row["errors"] == count // 4
    for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        assert row[name] == sum(book[name] for book in books.values()), name
    expected = sum(batch_cost_nanos(model, book) for model, book in books.items())
    assert row["cost_nanos"] == expected > 0
