"""Anthropic's Messages API as a loopback upstream that checks what it receives (see
``native_upstreams``): JSON and SSE with Anthropic's event types, prompt-caching usage and
``count_tokens``."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web
from native_upstreams import (
    TOOL_ARGUMENTS,
    NativeUpstream,
    Seen,
    Turn,
    answer_text,
    cache_marked,
    sse,
    stream_events,
    text_of,
    wants_tool,
)


class FakeAnthropic(NativeUpstream):
    """Anthropic's Messages API; a request with any ``cache_control`` marker reports cache
    writes and reads, as a prompt-cached conversation does."""

    cache_write = 30
    cache_read = 40

    def __init__(self, name: str, key: str, version: str = "2023-06-01") -> None:
        super().__init__(name, key)
        self.version = version

    def refusal(self, seen: Seen) -> str | None:
        if seen.headers.get("x-api-key") != self.key:
            return "invalid x-api-key"
        if seen.headers.get("anthropic-version") != self.version:
            return "anthropic-version: header is required"
        if "authorization" in seen.headers:
            return "an Authorization header reached Anthropic"
        return None

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)

    @staticmethod
    def error(status: int, kind: str, message: str) -> web.Response:
        return web.json_response(
            {"type": "error", "error": {"type": kind, "message": message}}, status=status
        )

    def _refused(self, refused: str) -> web.Response:
        if "x-api-key" in refused or "Authorization" in refused or "credential" in refused:
            return self.error(401, "authentication_error", refused)
        return self.error(400, "invalid_request_error", refused)

    @staticmethod
    def turn(body: dict[str, Any]) -> Turn:
        last_text, tool_result, has_image = "", None, False
        for message in body["messages"]:
            content = message["content"]
            if message["role"] != "user":
                continue
            blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
            texts = [b["text"] for b in blocks if b.get("type") == "text"]
            results = [b for b in blocks if b.get("type") == "tool_result"]
            has_image = has_image or any(b.get("type") == "image" for b in blocks)
            if results:
                tool_result = text_of(results[-1].get("content"))
            elif texts:
                tool_result = None
            if texts:
                last_text = " ".join(texts)
        tools = [tool["name"] for tool in body.get("tools") or []]
        return Turn(
            last_text, tools, tool_result, has_image, cache_marked(body), len(body["messages"])
        )

    async def count_tokens(self, request: web.Request) -> web.Response:
        seen, refused = await self._receive(request)
        if refused:
            return self._refused(refused)
        return web.json_response({"input_tokens": 10 + 3 * len(seen.body["messages"])})

    async def messages(self, request: web.Request) -> web.StreamResponse:
        seen, refused = await self._receive(request)
        if refused:
            return self._refused(refused)
        return await self.answer(request, seen.body)

    async def answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        """The Messages answer to ``body`` (its ``model`` named), JSON or a stream."""
        model = body["model"]
        if "ctx-overflow" in model:
            return self.error(
                400, "invalid_request_error", "prompt is too long: 900 tokens > 16 maximum"
            )
        if not isinstance(body.get("max_tokens"), int):
            return self.error(400, "invalid_request_error", "max_tokens: Field required")
        turn = self.turn(body)
        call = wants_tool(turn)
        text = "" if call else answer_text(self.name, turn)
        uncached = 15 + 3 * turn.messages
        written, read = (self.cache_write, self.cache_read) if turn.cache_marked else (0, 0)
        output = max(len(text.split()), 1)
        self._book(model, uncached + written + read, output, read, written)
        usage = {
            "input_tokens": uncached,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
            "output_tokens": output,
        }
        if call:
            block = {
                "type": "tool_use",
                "id": "toolu_1",
                "name": turn.tool_names[0],
                "input": TOOL_ARGUMENTS,
            }
        else:
            block = {"type": "text", "text": text}
        stop = "tool_use" if call else "end_turn"
        message = {
            "id": f"msg_{self.name}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [block],
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        if not body.get("stream"):
            return web.json_response(message)
        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {**usage, "output_tokens": 1},
        }
        events = [
            sse({"type": "message_start", "message": start}, "message_start"),
            sse({"type": "ping"}, "ping"),
        ]
        if call:
            shell = {**block, "input": {}}
            events.append(
                sse(
                    {"type": "content_block_start", "index": 0, "content_block": shell},
                    "content_block_start",
                )
            )
            arguments = orjson.dumps(TOOL_ARGUMENTS).decode()
            for piece in (arguments[:6], arguments[6:]):
                delta = {"type": "input_json_delta", "partial_json": piece}
                events.append(
                    sse(
                        {"type": "content_block_delta", "index": 0, "delta": delta},
                        "content_block_delta",
                    )
                )
        else:
            events.append(
                sse(
                    {
                        "type": "content_block_start",
                        "index": 0,
                        "content_block": {"type": "text", "text": ""},
                    },
                    "content_block_start",
                )
            )
            for index, word in enumerate(text.split(" ")):
                delta = {"type": "text_delta", "text": word if index == 0 else " " + word}
                events.append(
                    sse(
                        {"type": "content_block_delta", "index": 0, "delta": delta},
                        "content_block_delta",
                    )
                )
        if "mid-stream-error" in model:  # Anthropic's overloaded error, after the first bytes
            error = {"type": "overloaded_error", "message": f"Overloaded (key {self.key})"}
            events.append(sse({"type": "error", "error": error}, "error"))
            return await stream_events(request, events)
        events.append(sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        events.append(
            sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": output},
                },
                "message_delta",
            )
        )
        events.append(sse({"type": "message_stop"}, "message_stop"))
        return await stream_events(request, events)
