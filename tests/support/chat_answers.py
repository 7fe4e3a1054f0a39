"""The Chat Completions bodies the loopback providers and replicas answer with: a whole answer
(``chat_completion``) and one stream chunk (``chat_chunk``), each naming the server that sent it
in its id (``chatcmpl-<name>``), so a test can tell which one served a request."""

from __future__ import annotations

from typing import Any


def chat_completion(
    name: str, model: str, content: str, usage: dict[str, int], *, created: int
) -> dict[str, Any]:
    message = {"role": "assistant", "content": content}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
    return {
        "id": f"chatcmpl-{name}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage,
    }


def chat_chunk(
    name: str, model: str, delta: dict[str, Any], finish: str | None, *, created: int, **extra: Any
) -> dict[str, Any]:
    """One chunk of a single-choice stream; ``extra`` adds top-level fields (``usage``)."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {
        "id": f"chatcmpl-{name}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
        **extra,
    }
