"""A loopback OpenAI-compatible provider that keeps its own books: per request tag (the
request's ``user`` field), the model that served it and the tokens it reported or produced.

The upstream model name picks the behaviour (words joined by ``-``):

- ``flaky``: a 500 for tags whose last character is in ``FAIL_MARKS`` (then the gateway
  falls back elsewhere); a failed request produced nothing and is booked as a failure;
- ``drip``: ``DRIP_S`` seconds between stream chunks (clients disconnect mid-stream);
- ``cont``: running usage in every stream chunk (as vLLM's ``continuous_usage_stats``);
- ``mute``: no usage at all in streams (the gateway must estimate);
- ``cache``: half the prompt is reported as cached;
- ``chars``: the prompt is billed at one token per character of the message contents (as a
  tokenizer bills CJK text, about a token a character), not per word.

``/v1/embeddings`` books one prompt token per word of ``input``.

Its tokenizer: one token per whitespace-separated word of the message contents. A stream emits
one token per content chunk and notices a closed connection before producing the next one, so
what it books is what it produced.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from loopback import LoopbackServer

FAIL_MARKS = "02468"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
DRIP_S = 0.4


@dataclass
class ProviderRecord:
    """The provider's own record of one request tag."""

    model: str
    prompt: int = 0
    completion: int = 0
    cached: int = 0
    reported: bool = True  # False: the stream ended before usage was reported
    failed: bool = False


def count_prompt_chars(body: dict[str, Any]) -> int:
    """The ``chars`` tokenizer: one token per character of the string message contents."""
    return sum(
        len(message["content"])
        for message in body.get("messages") or []
        if isinstance(message.get("content"), str)
    )


def count_prompt_tokens(body: dict[str, Any]) -> int:
    words = 0
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            words += len(content.split())
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        words += len(prompt.split())
    return words


class CountingProvider(LoopbackServer):
    """Serve it on a thread: ``with ServedOnThread(CountingProvider()) as provider:``."""

    # A stream notices a closed connection when it next writes, as real servers do.
    handler_cancellation = False

    def __init__(self) -> None:
        super().__init__()
        self.books: dict[str, ProviderRecord] = {}
        self.failures: dict[str, int] = {}
        self.metadata: dict[str, Any] = {}  # the body's ``metadata`` as it arrived, per tag
        self.lock = threading.Lock()
        self.in_flight = 0  # requests being answered: each books itself when it ends

    def snapshot(self, settle_s: float = 10.0) -> dict[str, ProviderRecord]:
        """The books once every request being answered has booked itself (a stream books
        after its last byte, which its client may have read already), or after ``settle_s``."""
        deadline = time.monotonic() + settle_s
        while True:
            with self.lock:
                if self.in_flight == 0 or time.monotonic() >= deadline:
                    return dict(self.books)
            time.sleep(0.01)

    async def _counted(self, handler: Handler, request: web.Request) -> web.StreamResponse:
        with self.lock:
            self.in_flight += 1
        try:
            return await handler(request)
        finally:
            with self.lock:
                self.in_flight -= 1

    def _book(self, tag: str, served: ProviderRecord) -> None:
        with self.lock:
            if tag in self.books:
                raise AssertionError(f"tag {tag} served twice")
            self.books[tag] = served

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", lambda r: self._counted(self._chat, r))
        app.router.add_post("/v1/embeddings", lambda r: self._counted(self._embeddings, r))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json(loads=orjson.loads)
        model = str(body.get("model", ""))
        traits = set(model.split("-"))
        tag = str(body.get("user", ""))
        with self.lock:
            self.metadata[tag] = body.get("metadata")
        if "flaky" in traits and tag[-1:] in FAIL_MARKS:
            with self.lock:
                self.failures[tag] = self.failures.get(tag, 0) + 1
            return web.json_response({"error": {"message": "flaky upstream"}}, status=500)
        prompt = count_prompt_chars(body) if "chars" in traits else count_prompt_tokens(body)
        cached = prompt // 2 if "cache" in traits else 0
        completion = body.get("max_tokens") if isinstance(body.get("max_tokens"), int) else 4
        if not body.get("stream"):
            self._book(tag, ProviderRecord(model, prompt, completion, cached))
            return web.json_response(
                {
                    "id": "chatcmpl-" + tag,
                    "object": "chat.completion",
                    "created": 0,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "tok " * completion},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": _usage(prompt, completion, cached),
                }
            )
        return await self._stream(request, body, model, traits, tag, prompt, completion, cached)

    async def _embeddings(self, request: web.Request) -> web.Response:
        """One token per word of ``input`` (a string or a list of strings), booked per tag."""
        body = await request.json(loads=orjson.loads)
        model = str(body.get("model", ""))
        inputs = body.get("input")
        texts = [inputs] if isinstance(inputs, str) else [str(t) for t in inputs or []]
        prompt = sum(len(text.split()) for text in texts)
        self._book(str(body.get("user", "")), ProviderRecord(model, prompt, 0, 0))
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": [0.25, 0.5]}
                    for i in range(len(texts))
                ],
                "model": model,
                "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
            }
        )

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        model: str,
        traits: set[str],
        tag: str,
        prompt: int,
        completion: int,
        cached: int,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        report = wants_usage and "mute" not in traits
        served = ProviderRecord(model, prompt, 0, cached, reported=False)
        try:
            for _ in range(completion):
                if "drip" in traits:
                    await asyncio.sleep(DRIP_S)
                if request.transport is None or request.transport.is_closing():
                    break  # the gateway cancelled: produce nothing more
                served.completion += 1
                chunk: dict[str, Any] = _chunk(model, {"content": "tok "}, None)
                if report and "cont" in traits:
                    chunk["usage"] = _usage(prompt, served.completion, cached)
                    served.reported = True
                await response.write(_sse(chunk))
            else:
                await response.write(_sse(_chunk(model, {}, "stop")))
                if report:
                    final = {**_chunk(model, {}, None), "choices": []}
                    final["usage"] = _usage(prompt, served.completion, cached)
                    await response.write(_sse(final))
                    served.reported = True
                await response.write(b"data: [DONE]\n\n")
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._book(tag, served)
        return response


def _usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _chunk(model: str, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-stream",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"
