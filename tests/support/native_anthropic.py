"""Anthropic's Messages API as a loopback upstream that checks what it receives (see
``native_upstreams``): JSON and SSE with Anthropic's event types, prompt-caching usage,
``count_tokens`` and Message Batches (a batch ends after a poll or two, ``native_batches``)."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from aiohttp import web
from native_batches import BatchQueue, FakeBatch
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
        self.batches = BatchQueue("msgbatch_")

    def reset(self) -> None:
        super().reset()
        self.batches.reset()

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
        app.router.add_post("/v1/messages/batches", self.create_batch)
        app.router.add_get("/v1/messages/batches/{batch_id}", self.get_batch)
        app.router.add_get("/v1/messages/batches/{batch_id}/results", self.batch_results)
        app.router.add_post("/v1/messages/batches/{batch_id}/cancel", self.cancel_batch)

    # -- Message Batches -------------------------------------------------------------------

    def batch_view(self, batch: FakeBatch) -> dict[str, Any]:
        ended = batch.status == "ended"
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        if not ended:
            counts["processing"] = len(batch.requests)
        for result in batch.results:
            if result.outcome == "answered":
                counts["succeeded" if result.status < 400 else "errored"] += 1
            else:
                counts["canceled" if result.outcome == "cancelled" else "expired"] += 1
        status = {"running": "in_progress", "cancelling": "canceling"}.get(batch.status, "ended")
        results_url = f"{self.url}/messages/batches/{batch.id}/results" if ended else None
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": status,
            "request_counts": counts,
            "results_url": results_url,
        }

    async def create_batch(self, request: web.Request) -> web.Response:
        seen, refused = await self._receive(request)
        if refused:
            return self._refused(refused)
        items = seen.body.get("requests")
        if not isinstance(items, list) or not items:
            return self.error(400, "invalid_request_error", "requests: Field required")
        for index, item in enumerate(items):
            if set(item) != {"custom_id", "params"}:
                return self.error(400, "invalid_request_error", f"requests.{index}: bad fields")
        batch = self.batches.submit([(item["custom_id"], item["params"]) for item in items])
        return web.json_response(self.batch_view(batch))

    async def get_batch(self, request: web.Request) -> web.Response:
        _, refused = await self._receive(request)
        if refused:
            return self._refused(refused)

        async def run(params: dict[str, Any]) -> tuple[int, Any]:
            headers = {"x-api-key": self.key, "anthropic-version": self.version}
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{self.url}/messages", json=params, headers=headers) as reply,
            ):
                return reply.status, await reply.json(content_type=None)

        batch = await self.batches.look(request.match_info["batch_id"], run)
        if batch is None:
            return self.error(404, "not_found_error", "No such message batch")
        return web.json_response(self.batch_view(batch))

    async def batch_results(self, request: web.Request) -> web.Response:
        _, refused = await self._receive(request)
        if refused:
            return self._refused(refused)
        batch = self.batches.batches.get(request.match_info["batch_id"])
        if batch is None or batch.status != "ended":
            return self.error(404, "not_found_error", "No results for this message batch")
        lines = []
        for result in batch.results:
            if result.outcome == "answered" and result.status < 400:
                kind: dict[str, Any] = {"type": "succeeded", "message": result.body}
            elif result.outcome == "answered":
                kind = {"type": "errored", "error": result.body}
            else:
                kind = {"type": "canceled" if result.outcome == "cancelled" else "expired"}
            lines.append(orjson.dumps({"custom_id": result.custom_id, "result": kind}) + b"\n")
        return web.Response(body=b"".join(lines), content_type="application/binary")

    async def cancel_batch(self, request: web.Request) -> web.Response:
        _, refused = await self._receive(request)
        if refused:
            return self._refused(refused)
        batch = self.batches.cancel(request.match_info["batch_id"])
        if batch is None:
            return self.error(404, "not_found_error", "No such message batch")
        return web.json_response(self.batch_view(batch))

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
