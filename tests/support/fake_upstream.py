"""A small, fast OpenAI-compatible upstream on raw asyncio streams, for benchmarks and tests.

It speaks just enough HTTP/1.1 (keep-alive, Content-Length bodies, chunked SSE replies) to be
far cheaper than the gateway in front of it. The requested model name selects a behaviour:

- ``fail-400…``: a 400 in OpenAI's envelope;  ``fail-500…``: a 500;
- ``slow…``: answers after ``slow_s`` seconds (timeout tests);
- ``break…``: a stream cut after two chunks (a non-stream request gets its connection closed);
- ``drip…``: a stream with ``drip_s`` seconds between chunks;
- ``burst…``: a stream sent whole in one write (its head, every chunk and the end);
- anything else: a normal answer.

``POST /v1/traces`` is an OTLP/HTTP collector that drops what it gets (the benchmark's traced
gateway exports there). Usage is ``prompt_tokens`` = 10 and ``completion_tokens`` =
  ``max_tokens`` (or 5), so tests can predict costs.

It answers chat and text completions, embeddings, image generations, moderations and speech
(a few audio bytes); any other path is a 404 in OpenAI's envelope.

Run standalone with ``python tests/support/fake_upstream.py --port 9100``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson

PROMPT_TOKENS = 10
DEFAULT_COMPLETION_TOKENS = 5
CONTENT = "Hello from the fake upstream."


@dataclass(frozen=True)
class SeenRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def _usage(body: dict[str, Any]) -> dict[str, int]:
    completion = body.get("max_tokens") or body.get("max_completion_tokens")
    if not isinstance(completion, int):
        completion = DEFAULT_COMPLETION_TOKENS
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": completion,
        "total_tokens": PROMPT_TOKENS + completion,
    }


def _completion(
    chat: bool, kind: str, created: int, model: str, choices: list[Any], **extra: Any
) -> dict[str, Any]:
    """What every completion answers in: a whole answer's or a stream chunk's envelope."""
    return {
        "id": "chatcmpl-fake" if chat else "cmpl-fake",
        "object": kind,
        "created": created,
        "model": model,
        "choices": choices,
        **extra,
    }


def _head(status: int, content_type: str, length: int | None) -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}
    lines = [f"HTTP/1.1 {status} {reason.get(status, 'Error')}", f"Content-Type: {content_type}"]
    lines.append(
        f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    )
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _json(status: int, data: Any) -> bytes:
    payload = orjson.dumps(data)
    return _head(status, "application/json", len(payload)) + payload


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _event(data: Any) -> bytes:
    return _chunk(b"data: " + (data if isinstance(data, bytes) else orjson.dumps(data)) + b"\n\n")


class FakeUpstream:
    def __init__(self, slow_s: float = 2.0, drip_s: float = 0.2, keep: int = 200) -> None:
        self.slow_s = slow_s
        self.drip_s = drip_s
        self.requests: deque[SeenRequest] = deque(maxlen=keep)
        self.server: asyncio.Server | None = None
        self.port = 0
        self._connections: set[asyncio.Task[Any]] = set()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = await asyncio.start_server(self._serve, host, port, backlog=1024)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            # Keep-alive connections outlive close(): end them so no task is left pending.
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2)
            self.server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                request_line, *header_lines = head.decode("latin-1").split("\r\n")
                method, path, _ = request_line.split(" ", 2)
                headers = {}
                for line in header_lines:
                    name, sep, value = line.partition(":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0"))
                raw = await reader.readexactly(length) if length else b""
                if not await self._respond(writer, method, path, headers, raw):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _respond(
        self,
        writer: asyncio.StreamWriter,
        method: str,
        path: str,
        headers: dict[str, str],
        raw: bytes,
    ) -> bool:
        """Write one response; False closes the connection."""
        if path == "/v1/traces":  # protobuf spans: accepted and dropped (an empty reply)
            writer.write(_head(200, "application/x-protobuf", 0))
            return True
        try:
            body = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            writer.write(_json(400, {"error": {"message": "invalid JSON", "type": "invalid"}}))
            return True
        self.requests.append(SeenRequest(path, headers, body))
        model = str(body.get("model", ""))
        if method == "GET" and path.endswith("/models"):
            writer.write(_json(200, {"object": "list", "data": []}))
            return True
        if model.startswith("fail-400"):
            error = {
                "message": "fake upstream rejected the request: bad messages",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "bad_input",
            }
            writer.write(_json(400, {"error": error}))
            return True
        if model.startswith("fail-500"):
            writer.write(_json(500, {"error": {"message": "fake upstream crashed"}}))
            return True
        if model.startswith("slow"):
            await asyncio.sleep(self.slow_s)
        if body.get("stream"):
            return await self._stream(writer, path, model, body)
        if model.startswith("break"):
            return False
        if path.endswith("/audio/speech"):
            audio = b"ID3fake-audio"
            writer.write(_head(200, "audio/mpeg", len(audio)) + audio)
            return True
        answer = self._answer(path, model, body)
        if answer is None:
            error = {"message": f"no route {path}", "type": "invalid_request_error"}
            writer.write(_json(404, {"error": error}))
            return True
        writer.write(_json(200, answer))
        return True

    def _answer(self, path: str, model: str, body: dict[str, Any]) -> dict[str, Any] | None:
        created = int(time.time())
        if path.endswith("/chat/completions"):
            message = {"role": "assistant", "content": CONTENT, "refusal": None}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
            return _completion(
                True, "chat.completion", created, model, [choice], usage=_usage(body)
            )
        if path.endswith("/completions"):
            choice = {"text": CONTENT, "index": 0, "logprobs": None, "finish_reason": "stop"}
            return _completion(
                False, "text_completion", created, model, [choice], usage=_usage(body)
            )
        if path.endswith("/embeddings"):
            inputs = body.get("input")
            count = len(inputs) if isinstance(inputs, list) else 1
            return {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]}
                    for i in range(count)
                ],
                "model": model,
                "usage": {"prompt_tokens": PROMPT_TOKENS, "total_tokens": PROMPT_TOKENS},
            }
        if path.endswith("/images/generations"):
            return {"created": created, "data": [{"url": "https://example.invalid/fake.png"}]}
        if path.endswith("/moderations"):
            result = {"flagged": False, "categories": {}, "category_scores": {}}
            return {"id": "modr-fake", "model": model, "results": [result]}
        return None

    async def _stream(
        self, writer: asyncio.StreamWriter, path: str, model: str, body: dict[str, Any]
    ) -> bool:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        usage_field: dict[str, Any] = {"usage": None} if include_usage else {}
        created = int(time.time())
        chat = path.endswith("/chat/completions")
        kind = "chat.completion.chunk" if chat else "text_completion"
        pieces = ["Hello", " from", " the", " fake", " upstream."]

        def chunk(text: str | None, finish: str | None) -> dict[str, Any]:
            if chat:
                delta = {} if text is None else {"content": text}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"text": text or "", "index": 0, "logprobs": None, "finish_reason": finish}
            return _completion(chat, kind, created, model, [choice], **usage_field)

        if model.startswith("burst"):
            events = [chunk(piece, None) for piece in pieces] + [chunk(None, "stop")]
            if include_usage:
                events.append(_completion(chat, kind, created, model, [], usage=_usage(body)))
            whole = [_head(200, "text/event-stream", None), *map(_event, events)]
            writer.write(b"".join([*whole, _event(b"[DONE]"), b"0\r\n\r\n"]))
            await writer.drain()
            return True
        writer.write(_head(200, "text/event-stream", None))
        for index, piece in enumerate(pieces):
            writer.write(_event(chunk(piece, None)))
            await writer.drain()
            if model.startswith("break") and index == 1:
                return False  # cut mid-stream: no terminating chunk, connection closed
            if model.startswith("drip"):
                await asyncio.sleep(self.drip_s)
        writer.write(_event(chunk(None, "stop")))
        if include_usage:
            writer.write(_event(_completion(chat, kind, created, model, [], usage=_usage(body))))
        writer.write(_event(b"[DONE]"))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


class ThreadedFakeUpstream:
    """A FakeUpstream on its own thread and event loop (tests call the gateway synchronously)."""

    def __init__(self, **options: Any) -> None:
        self.upstream = FakeUpstream(**options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> FakeUpstream:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.upstream.start(), self._loop).result(10)
        return self.upstream

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.upstream.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="fast fake OpenAI-compatible upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    args = parser.parse_args()

    async def serve() -> None:
        upstream = FakeUpstream()
        await upstream.start(args.host, args.port)
        print(f"fake upstream on {upstream.base_url}", flush=True)
        await asyncio.Event().wait()

    try:
        import uvloop

        uvloop.run(serve())
    except ImportError:
        asyncio.run(serve())


if __name__ == "__main__":
    main()
