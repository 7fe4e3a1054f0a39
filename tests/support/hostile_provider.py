"""A loopback OpenAI-compatible upstream that misbehaves on cue, chosen by the model name.

It runs aiohttp on its own thread and event loop. Every error text it sends quotes the
credential it was sent (``Authorization: Bearer …``), the way careless providers and proxies do,
so a test can tell whether the gateway relays it:

- ``leak-500``  a 500 whose JSON message holds the key, a bearer header and a long tail;
- ``text-500``  a 500 with a plain-text body holding the key;
- ``auth-401`` / ``auth-403``  the provider refuses the gateway's key (OpenAI's envelope);
- ``bad-400``   a 400 whose message quotes the key, with a type, param and code;
- ``stream-error``  a 200 stream: one chunk, then ``data: {"error": {...}}`` quoting the key;
- ``huge-json`` a 200 JSON answer of ``huge_bytes``, sent chunked without a Content-Length;
- ``huge-sse``  a 200 stream: one chunk, then one ``data:`` line of ``huge_bytes``;
- ``huge-error`` a 500 of ``huge_bytes``;
- anything else: a normal answer (``stream`` honoured).

``sent`` counts the body bytes each huge answer managed to write before the gateway hung up.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiohttp import web
from loopback import LoopbackServer

CHUNK = 64 * 1024


def _usage() -> dict[str, int]:
    return {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def _answer(model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-hostile",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "fine"},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": _usage(),
    }


def _chunk(model: str, content: str) -> bytes:
    event = {
        "id": "chatcmpl-hostile",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(event) + b"\n\n"


class HostileUpstream(LoopbackServer):
    """Serve it on a thread: ``with ServedOnThread(HostileUpstream()) as upstream:``."""

    def __init__(self, huge_bytes: int = 200 * 1024 * 1024) -> None:
        super().__init__()
        self.huge_bytes = huge_bytes
        self.sent: dict[str, int] = {}
        self.cookies_seen: list[str] = []  # every Cookie header a request came with

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._handle)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        model = str(body.get("model", ""))
        # What a careless upstream echoes: the credential it was sent.
        credential = request.headers.get("Authorization", "")
        key = credential.removeprefix("Bearer ")
        if "Cookie" in request.headers:
            self.cookies_seen.append(request.headers["Cookie"])
        if model == "set-cookie":  # a session for whoever sent this: never for anyone else
            response = web.json_response(_answer(model))
            response.set_cookie("session", f"of-the-caller-{body.get('user', '')}")
            return response
        if model == "leak-500":
            message = f"backend failure for {credential}; api_key={key}; " + "detail " * 2000
            return web.json_response({"error": {"message": message}}, status=500)
        if model == "text-500":
            return web.Response(status=500, text=f"proxy error: upstream refused key {key}")
        if model in ("auth-401", "auth-403"):
            error = {
                "message": f"Incorrect API key provided: {key}.",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            }
            return web.json_response({"error": error}, status=int(model[-3:]))
        if model == "bad-400":
            error = {
                "message": f"max_tokens is too large for key {key}: " + "x" * 5000,
                "type": "invalid_request_error",
                "param": "max_tokens",
                "code": "invalid_value",
            }
            return web.json_response({"error": error}, status=400)
        if model == "huge-json":
            return await self._huge(request, model, b'{"id": "x", "pad": "', 200)
        if model == "huge-error":
            return await self._huge(request, model, b'{"error": {"message": "', 500)
        if body.get("stream") is True:
            return await self._stream(request, model, key)
        return web.json_response(_answer(model))

    async def _huge(
        self, request: web.Request, model: str, head: bytes, status: int
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=status, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        self.sent[model] = 0
        block = b"a" * CHUNK
        try:
            await response.write(head)
            while self.sent[model] < self.huge_bytes:
                await response.write(block)
                self.sent[model] += len(block)
            await response.write(b'"}}')
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass  # the gateway hung up: what it refused to read
        return response

    async def _stream(self, request: web.Request, model: str, key: str) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_chunk(model, "hello"))
        if model == "stream-error":
            error = {"error": {"message": f"overloaded; retry with {key}", "type": "server_error"}}
            await response.write(b"data: " + orjson.dumps(error) + b"\n\n")
            await response.write_eof()
            return response
        if model == "huge-sse":
            self.sent[model] = 0
            block = b"b" * CHUNK
            try:
                await response.write(b'data: {"pad": "')
                while self.sent[model] < self.huge_bytes:
                    await response.write(block)
                    self.sent[model] += len(block)
                await response.write(b'"}\n\n')
            except (ConnectionError, asyncio.CancelledError):
                return response
        usage = {"id": "chatcmpl-hostile", "object": "chat.completion.chunk", "choices": []}
        await response.write(b"data: " + orjson.dumps({**usage, "usage": _usage()}) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
