"""An OpenAI-compatible chat upstream that takes its time and keeps a log of arrivals, for the
batch tests that stop a batch mid-run: cancel, expiry, a replica killed.

Each request is known by its tag, the text of its last message; ``arrivals`` lists every tag
in the order its request arrived (a tag twice: the request came twice). ``delay_s`` is how long
each answer takes. ``throttle`` names tags whose first request gets a 429 with ``Retry-After``
(as a provider's rate limit would), the second an answer. Usage: 10 prompt tokens, 5 completion
tokens each.
"""

from __future__ import annotations

import asyncio
import threading
import time

import orjson
from aiohttp import web
from loopback import LoopbackServer

PROMPT_TOKENS = 10
COMPLETION_TOKENS = 5


class SlowUpstream(LoopbackServer):
    name = "slow"

    def __init__(self, delay_s: float = 0.2) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.throttle: set[str] = set()
        self.retry_after_s = 1
        self._lock = threading.Lock()
        self._arrivals: list[tuple[str, float]] = []
        self._answered: list[str] = []

    @property
    def arrivals(self) -> list[str]:
        with self._lock:
            return [tag for tag, _ in self._arrivals]

    def arrived_after(self, moment: float) -> list[str]:
        """Tags whose request arrived after ``moment`` (``time.monotonic()``)."""
        with self._lock:
            return [tag for tag, at in self._arrivals if at > moment]

    @property
    def answered(self) -> list[str]:
        with self._lock:
            return list(self._answered)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json(loads=orjson.loads)
        tag = str(body["messages"][-1]["content"])
        with self._lock:
            first = tag not in (seen for seen, _ in self._arrivals)
            self._arrivals.append((tag, time.monotonic()))
        if first and tag in self.throttle:
            error = {"message": "rate limited", "type": "requests", "code": "rate_limit_exceeded"}
            return web.json_response(
                {"error": error}, status=429, headers={"retry-after": str(self.retry_after_s)}
            )
        await asyncio.sleep(self.delay_s)
        with self._lock:
            self._answered.append(tag)
        usage = {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        }
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": f"answer to {tag}"},
            "finish_reason": "stop",
        }
        return web.json_response(
            {
                "id": "chatcmpl-slow",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [choice],
                "usage": usage,
            }
        )


def slow_policy(url: str) -> str:
    return f"""
providers:
  slow:
    base_url: {url}
    timeout_s: 30
models:
  slow-model:
    provider: slow
    price: {{input: 1, output: 2, batch: {{input: 0.5, output: 1}}}}
"""
