"""The one seam between a batch and the interactive pipeline: ``LineRunner``.

A runner hands each line to ``run(LineCall(...))`` and gets back what an interactive client
would have got for the same request with the same key: the status, the body (an answer or the
door's error envelope) and the usage charged. The pipeline's side lives with the API
(``gateway/api/v1/batch_line.py``), which is built above this part and passed in, so the batch
runner never reaches up into the HTTP layer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.batches.records import LineAnswer


@dataclass(frozen=True, slots=True)
class LineCall:
    key_id: str  # the batch's key: its limits, budgets, models and tags apply
    endpoint: str  # the /v1 path (``/v1/chat/completions``, ``/v1/messages``, ...)
    body: dict[str, Any]
    batch_id: str  # the usage event is tagged ``batch:<id>`` and priced at the batch price
    request_id: str


@dataclass(frozen=True, slots=True)
class LineResult:
    status: int
    body: bytes  # JSON: the answer, or the door's error envelope
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retry_after_s: float | None = None  # a 429's Retry-After
    should_retry: bool = True  # False: a 429 that waiting will not cure (a spent budget)


LineRunner = Callable[[LineCall], Awaitable[LineResult]]


def line_answer(result: LineResult) -> LineAnswer:
    """What the store keeps of a line's result: its status, its body as JSON text (a body that
    is not JSON is wrapped, never lost)."""
    try:
        text = orjson.dumps(orjson.loads(result.body)).decode()
    except orjson.JSONDecodeError:
        text = orjson.dumps({"raw": result.body.decode("utf-8", "replace")}).decode()
    return LineAnswer(result.status, text)
