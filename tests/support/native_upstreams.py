"""Loopback upstreams that speak each provider's native wire format, and keep books.

- ``FakeOpenAI`` (``native_openai``): OpenAI's API under ``/v1`` (chat completions and the Responses API, JSON and
  SSE; embeddings, moderations, audio transcriptions/translations/speech, image edits; the
  Files and Batch API, a batch ending after a poll or two: ``native_batches``).
- ``FakeAzure`` (``native_openai``): Azure OpenAI's deployment paths
  (``/openai/deployments/{deployment}/chat/completions?api-version=...``, audio too), with
  Azure's leading ``prompt_filter_results`` stream chunk.
- ``FakeEngineReplica`` (``native_openai``): an engine replica as vLLM serves one, OpenAI's
  API under ``/v1`` and Prometheus ``/metrics``, for a ``kind: engine_fleet`` provider.
- ``FakeAnthropic`` (``native_anthropic``): Anthropic's Messages API under ``/v1`` (JSON and SSE with its event
  types, prompt-caching usage, ``count_tokens``, Message Batches).

Each checks what it receives before answering, as the real one would: its own credential in its
own header (``Authorization: Bearer``, ``api-key``, ``x-api-key`` with ``anthropic-version``),
Azure's ``api-version``, and that no client credential of the gateway (``sk-sy-...``) reached
it in any header. A refused request gets the provider's own error envelope and status.

Every request is kept (``seen``: path, query, headers, body) and every answer's usage is
added to the fake's ``books`` (per model: prompt, completion, cached, cache_write tokens, in
the internal convention: prompt counts cache reads and writes), so a test can compare the
gateway's usage report with what the upstreams themselves said, to the token.

The answers are deterministic: offered tools and no tool result yet → a call of the first
tool with ``{"city": "Paris"}``; otherwise a text naming the fake and echoing the last user
text (or the tool result it was sent). Model names trigger errors: ``ctx-overflow`` → the
provider's context-length error, ``filtered`` → its content-filter error,
``mid-stream-error`` → (Anthropic) an ``error`` event after the stream's first events.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from loopback import LoopbackFleet, LoopbackServer

CLIENT_KEY_PREFIX = "sk-sy-"
TOOL_ARGUMENTS = {"city": "Paris"}


@dataclass
class Seen:
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: Any  # the JSON body, or the raw bytes of an upload


@dataclass(frozen=True)
class Turn:
    """What a fake reads of a chat request, whatever its format."""

    last_text: str
    tool_names: list[str]
    tool_result: str | None
    has_image: bool
    cache_marked: bool
    messages: int


class NativeUpstream(LoopbackServer):
    """A fake provider: ``seen`` requests, ``books`` of reported usage, its expected key."""

    client_max_size = 64 * 1024 * 1024

    def __init__(self, name: str, key: str) -> None:
        super().__init__()
        self.name = name
        self.key = key
        self._lock = threading.Lock()
        self._seen: list[Seen] = []
        self._books: dict[str, Counter[str]] = defaultdict(Counter)

    # -- test-facing --------------------------------------------------------------------

    @property
    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)

    def books(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {model: dict(counts) for model, counts in self._books.items()}

    def reset(self) -> None:
        with self._lock:
            self._seen.clear()
            self._books.clear()

    # -- shared --------------------------------------------------------------------------

    def _book(self, model: str, prompt: int, completion: int, cached: int, written: int) -> None:
        with self._lock:
            counts = self._books[model]
            counts["requests"] += 1
            counts["prompt_tokens"] += prompt
            counts["completion_tokens"] += completion
            counts["cached_tokens"] += cached
            counts["cache_write_tokens"] += written

    async def _receive(self, request: web.Request) -> tuple[Seen, str | None]:
        """Keep the request; the refusal reason when it breaks the provider's rules."""
        raw = await request.read()
        content_type = request.headers.get("content-type", "")
        body: Any = raw
        if content_type.startswith("application/json"):
            body = orjson.loads(raw)
        headers = {key.lower(): value for key, value in request.headers.items()}
        seen = Seen(request.path, dict(request.query), headers, body)
        with self._lock:
            self._seen.append(seen)
        for name, value in headers.items():
            if CLIENT_KEY_PREFIX in value:
                return seen, f"a client credential reached the upstream in {name}"
        return seen, self.refusal(seen)

    def refusal(self, seen: Seen) -> str | None:
        raise NotImplementedError


def answer_text(name: str, turn: Turn) -> str:
    if turn.tool_result is not None:
        return f"{name} read the tool result: {turn.tool_result}"
    return f"{name} says: {turn.last_text}"


def wants_tool(turn: Turn) -> bool:
    return bool(turn.tool_names) and turn.tool_result is None


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part.get("text", "") for part in content if isinstance(part, dict) and "text" in part
        )
    return ""


def cache_marked(value: Any) -> bool:
    if isinstance(value, dict):
        return "cache_control" in value or any(cache_marked(item) for item in value.values())
    if isinstance(value, list):
        return any(cache_marked(item) for item in value)
    return False


def sse(payload: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"


async def stream_events(request: web.Request, events: list[bytes]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in events:
        await response.write(event)
    await response.write_eof()
    return response


def form_fields(seen: Seen) -> dict[str, Any]:
    """A multipart body's parts: text fields as str, files as bytes (by field name)."""
    content_type = seen.headers["content-type"]
    boundary = content_type.split("boundary=", 1)[1].strip('"').encode()
    fields: dict[str, Any] = {}
    for part in seen.body.split(b"--" + boundary)[1:]:
        if part.startswith(b"--"):
            break
        headers, _, value = part[2:].partition(b"\r\n\r\n")
        value = value[:-2]  # the CRLF before the next delimiter
        name = headers.split(b'name="', 1)[1].split(b'"', 1)[0].decode()
        fields[name] = value if b"filename=" in headers else value.decode()
    return fields


class NativeFleet(LoopbackFleet[Any]):  # Any: each fake has attributes of its own
    """Several native upstreams on one background loop; a context manager."""

    def __init__(self, *upstreams: NativeUpstream) -> None:
        super().__init__(upstreams)

    def reset(self) -> None:
        for upstream in self.servers.values():
            upstream.reset()
