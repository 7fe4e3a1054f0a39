"""Loopback upstreams that speak each provider's native wire format, and keep books.

- ``FakeOpenAI``: OpenAI's API under ``/v1`` (chat completions and the Responses API, JSON and
  SSE; embeddings, moderations, audio transcriptions/translations/speech, image edits).
- ``FakeAzure``: Azure OpenAI's deployment paths
  (``/openai/deployments/{deployment}/chat/completions?api-version=...``, audio too), with
  Azure's leading ``prompt_filter_results`` stream chunk.
- ``FakeAnthropic``: Anthropic's Messages API under ``/v1`` (JSON and SSE with its event
  types, prompt-caching usage, ``count_tokens``).

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
provider's context-length error, ``filtered`` → its content-filter error.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from loopback import BackgroundLoop, LoopbackServer

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


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part.get("text", "") for part in content if isinstance(part, dict) and "text" in part
        )
    return ""


def _marked(value: Any) -> bool:
    if isinstance(value, dict):
        return "cache_control" in value or any(_marked(item) for item in value.values())
    if isinstance(value, list):
        return any(_marked(item) for item in value)
    return False


def _sse(payload: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"


async def _stream(request: web.Request, events: list[bytes]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in events:
        await response.write(event)
    await response.write_eof()
    return response


# -- OpenAI and Azure ---------------------------------------------------------------------


class OpenAIStyle(NativeUpstream):
    """What OpenAI and Azure OpenAI share: Chat Completions, and the other operations."""

    cached_tokens = 6
    leading_filter_chunk = False

    def openai_error(self, status: int, message: str, code: str | None = None) -> web.Response:
        error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
        return web.json_response({"error": error}, status=status)

    def model_error(self, model: str) -> web.Response | None:
        if "ctx-overflow" in model:
            return self.openai_error(
                400,
                "This model's maximum context length is 16 tokens. However, your messages "
                "resulted in 900 tokens.",
                "context_length_exceeded",
            )
        if "filtered" in model:
            return self.openai_error(
                400,
                "The response was filtered due to the prompt triggering the content "
                "management policy.",
                "content_filter",
            )
        return None

    @staticmethod
    def chat_turn(body: dict[str, Any]) -> Turn:
        messages = body.get("messages") or []
        last_text, tool_result, has_image = "", None, False
        for message in messages:
            content = message.get("content")
            if isinstance(content, list):
                has_image = has_image or any(p.get("type") == "image_url" for p in content)
            if message.get("role") == "user":
                last_text, tool_result = _text_of(content), None
            elif message.get("role") == "tool":
                tool_result = _text_of(content)
        tools = [tool["function"]["name"] for tool in body.get("tools") or []]
        return Turn(last_text, tools, tool_result, has_image, False, len(messages))

    def chat_usage(self, model: str, turn: Turn, text: str) -> dict[str, Any]:
        prompt = 20 + 3 * turn.messages
        completion = max(len(text.split()), 1)
        self._book(model, prompt, completion, self.cached_tokens, 0)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": 0},
        }

    async def chat(self, request: web.Request, model_name: str | None = None) -> web.StreamResponse:
        seen, refused = await self._receive(request)
        if refused:
            return self.openai_error(401 if "credential" in refused else 400, refused)
        body = seen.body
        model = model_name or body["model"]
        failed = self.model_error(model)
        if failed is not None:
            return failed
        turn = self.chat_turn(body)
        call = wants_tool(turn)
        text = "" if call else answer_text(self.name, turn)
        usage = self.chat_usage(model, turn, text or "call")
        created = int(time.time())
        head = {"id": f"chatcmpl-{self.name}", "created": created, "model": model}
        tool_call = (
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": turn.tool_names[0],
                    "arguments": orjson.dumps(TOOL_ARGUMENTS).decode(),
                },
            }
            if call
            else None
        )
        finish = "tool_calls" if call else "stop"
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if tool_call:
                message["tool_calls"] = [tool_call]
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            return web.json_response(
                {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
            )

        def chunk(delta: dict[str, Any], reason: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            return _sse({**head, "object": "chat.completion.chunk", "choices": [choice]})

        events = []
        if self.leading_filter_chunk:
            events.append(
                _sse(
                    {
                        "choices": [],
                        "created": 0,
                        "id": "",
                        "model": "",
                        "object": "",
                        "prompt_filter_results": [
                            {"prompt_index": 0, "content_filter_results": {}}
                        ],
                    }
                )
            )
        events.append(chunk({"role": "assistant", "content": ""}))
        if tool_call:
            arguments = tool_call["function"]["arguments"]
            start = {
                **tool_call,
                "index": 0,
                "function": {"name": turn.tool_names[0], "arguments": ""},
            }
            events.append(chunk({"tool_calls": [start]}))
            for piece in (arguments[:5], arguments[5:]):
                events.append(
                    chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
                )
        else:
            words = text.split(" ")
            for index, word in enumerate(words):
                events.append(chunk({"content": word if index == 0 else " " + word}))
        events.append(chunk({}, finish))
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(
                _sse({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage})
            )
        events.append(b"data: [DONE]\n\n")
        return await _stream(request, events)

    async def embeddings(self, request: web.Request, model_name: str | None = None) -> web.Response:
        seen, refused = await self._receive(request)
        if refused:
            return self.openai_error(401, refused)
        model = model_name or seen.body["model"]
        self._book(model, 4, 0, 0, 0)
        return web.json_response(
            {
                "object": "list",
                "data": [{"object": "embedding", "index": 0, "embedding": [0.5, 0.25]}],
                "model": model,
                "usage": {"prompt_tokens": 4, "total_tokens": 4},
            }
        )

    async def transcription(
        self, request: web.Request, model_name: str | None = None
    ) -> web.Response:
        seen, refused = await self._receive(request)
        if refused:
            return self.openai_error(401, refused)
        form = _form_fields(seen)
        model = model_name or form.get("model", "")
        size = len(form.get("file", b""))
        self._book(model, 50, 7, 0, 0)
        usage = {
            "type": "tokens",
            "input_tokens": 50,
            "output_tokens": 7,
            "total_tokens": 57,
            "input_token_details": {"text_tokens": 0, "audio_tokens": 50},
        }
        return web.json_response(
            {"text": f"{self.name} heard {size} bytes as {model}", "usage": usage}
        )

    async def speech(self, request: web.Request, model_name: str | None = None) -> web.Response:
        seen, refused = await self._receive(request)
        if refused:
            return self.openai_error(401, refused)
        audio = b"ID3" + seen.body["input"].encode() * 10
        return web.Response(body=audio, content_type="audio/mpeg")

    async def image_edit(self, request: web.Request, model_name: str | None = None) -> web.Response:
        seen, refused = await self._receive(request)
        if refused:
            return self.openai_error(401, refused)
        form = _form_fields(seen)
        model = model_name or form.get("model", "")
        self._book(model, 30, 200, 0, 0)
        return web.json_response(
            {
                "created": int(time.time()),
                "data": [{"b64_json": "aGk="}],
                "usage": {
                    "input_tokens": 30,
                    "output_tokens": 200,
                    "total_tokens": 230,
                    "input_tokens_details": {"text_tokens": 10, "image_tokens": 20},
                },
            }
        )


def _form_fields(seen: Seen) -> dict[str, Any]:
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


class FakeOpenAI(OpenAIStyle):
    def refusal(self, seen: Seen) -> str | None:
        if seen.headers.get("authorization") != f"Bearer {self.key}":
            return "Incorrect API key provided"
        return None

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_post("/v1/moderations", self.moderation)
        app.router.add_post("/v1/audio/transcriptions", self.transcription)
        app.router.add_post("/v1/audio/translations", self.transcription)
        app.router.add_post("/v1/audio/speech", self.speech)
        app.router.add_post("/v1/images/edits", self.image_edit)

    async def moderation(self, request: web.Request) -> web.Response:
        seen, refused = await self._receive(request)
        if refused:
            return self.openai_error(401, refused)
        return web.json_response(
            {
                "id": "modr-1",
                "model": seen.body.get("model") or "omni-moderation-latest",
                "results": [{"flagged": False, "categories": {}, "category_scores": {}}],
            }
        )

    # -- the Responses API -----------------------------------------------------------------

    @staticmethod
    def responses_turn(body: dict[str, Any]) -> Turn:
        items = body["input"]
        if isinstance(items, str):
            return Turn(items, [], None, False, False, 1)
        last_text, tool_result, has_image = "", None, False
        for item in items:
            kind = item.get("type", "message")
            if kind == "message" and item.get("role") == "user":
                content = item.get("content")
                last_text, tool_result = _text_of(content), None
                if isinstance(content, list):
                    has_image = has_image or any(p.get("type") == "input_image" for p in content)
            elif kind == "function_call_output":
                tool_result = item.get("output") if isinstance(item.get("output"), str) else ""
        tools = [tool["name"] for tool in body.get("tools") or [] if tool.get("type") == "function"]
        return Turn(last_text, tools, tool_result, has_image, False, len(items))

    async def responses(self, request: web.Request) -> web.StreamResponse:
        seen, refused = await self._receive(request)
        if refused:
            return self.openai_error(401, refused)
        body = seen.body
        if body.get("store") is not False:
            return self.openai_error(400, "this fake expects store: false from the gateway")
        model = body["model"]
        turn = self.responses_turn(body)
        call = wants_tool(turn)
        text = "" if call else answer_text(self.name, turn)
        prompt, completion = 30 + 2 * turn.messages, max(len(text.split()), 1)
        self._book(model, prompt, completion, self.cached_tokens, 0)
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        }
        if call:
            item = {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": turn.tool_names[0],
                "arguments": orjson.dumps(TOOL_ARGUMENTS).decode(),
                "status": "completed",
            }
        else:
            item = {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        response = {
            "id": f"resp_{self.name}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": model,
            "output": [item],
            "usage": usage,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": body.get("tools") or [],
        }
        if not body.get("stream"):
            return web.json_response(response)
        sequence = iter(range(1000))

        def event(kind: str, **fields: Any) -> bytes:
            return _sse({"type": kind, "sequence_number": next(sequence), **fields}, kind)

        opening = {**response, "status": "in_progress", "output": [], "usage": None}
        events = [
            event("response.created", response=opening),
            event("response.in_progress", response=opening),
        ]
        if call:
            events.append(
                event(
                    "response.output_item.added",
                    output_index=0,
                    item={**item, "arguments": "", "status": "in_progress"},
                )
            )
            arguments = item["arguments"]
            for piece in (arguments[:4], arguments[4:]):
                events.append(
                    event(
                        "response.function_call_arguments.delta",
                        item_id="fc_1",
                        output_index=0,
                        delta=piece,
                    )
                )
            events.append(
                event(
                    "response.function_call_arguments.done",
                    item_id="fc_1",
                    output_index=0,
                    arguments=arguments,
                )
            )
        else:
            events.append(
                event(
                    "response.output_item.added",
                    output_index=0,
                    item={**item, "status": "in_progress", "content": []},
                )
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append(
                event(
                    "response.content_part.added",
                    item_id="msg_1",
                    output_index=0,
                    content_index=0,
                    part=part,
                )
            )
            for index, word in enumerate(text.split(" ")):
                events.append(
                    event(
                        "response.output_text.delta",
                        item_id="msg_1",
                        output_index=0,
                        content_index=0,
                        delta=word if index == 0 else " " + word,
                    )
                )
            events.append(
                event(
                    "response.output_text.done",
                    item_id="msg_1",
                    output_index=0,
                    content_index=0,
                    text=text,
                )
            )
            events.append(
                event(
                    "response.content_part.done",
                    item_id="msg_1",
                    output_index=0,
                    content_index=0,
                    part={**part, "text": text},
                )
            )
        events.append(event("response.output_item.done", output_index=0, item=item))
        events.append(event("response.completed", response=response))
        return await _stream(request, events)


class FakeAzure(OpenAIStyle):
    """Azure OpenAI: ``deployments`` maps a deployment name to the model it runs."""

    cached_tokens = 0
    leading_filter_chunk = True

    def __init__(self, name: str, key: str, api_version: str) -> None:
        super().__init__(name, key)
        self.api_version = api_version

    @property
    def url(self) -> str:  # an Azure resource endpoint has no /v1
        return f"http://127.0.0.1:{self.port}"

    def refusal(self, seen: Seen) -> str | None:
        if seen.headers.get("api-key") != self.key:
            return "Access denied due to invalid subscription key (credential)"
        if seen.query.get("api-version") != self.api_version:
            return f"api-version {seen.query.get('api-version')!r} is not {self.api_version!r}"
        if "authorization" in seen.headers:
            return "Azure got an Authorization header (credential) it did not ask for"
        return None

    def add_routes(self, app: web.Application) -> None:
        prefix = "/openai/deployments/{deployment}"
        app.router.add_post(prefix + "/chat/completions", self._deployed(self.chat))
        app.router.add_post(prefix + "/embeddings", self._deployed(self.embeddings))
        app.router.add_post(prefix + "/audio/transcriptions", self._deployed(self.transcription))

    def _deployed(self, handler: Any) -> Any:
        async def route(request: web.Request) -> web.StreamResponse:
            return await handler(request, request.match_info["deployment"])

        return route


# -- Anthropic ----------------------------------------------------------------------------


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
                tool_result = _text_of(results[-1].get("content"))
            elif texts:
                tool_result = None
            if texts:
                last_text = " ".join(texts)
        tools = [tool["name"] for tool in body.get("tools") or []]
        return Turn(last_text, tools, tool_result, has_image, _marked(body), len(body["messages"]))

    async def count_tokens(self, request: web.Request) -> web.Response:
        seen, refused = await self._receive(request)
        if refused:
            return self._refused(refused)
        return web.json_response({"input_tokens": 10 + 3 * len(seen.body["messages"])})

    async def messages(self, request: web.Request) -> web.StreamResponse:
        seen, refused = await self._receive(request)
        if refused:
            return self._refused(refused)
        body = seen.body
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
            _sse({"type": "message_start", "message": start}, "message_start"),
            _sse({"type": "ping"}, "ping"),
        ]
        if call:
            shell = {**block, "input": {}}
            events.append(
                _sse(
                    {"type": "content_block_start", "index": 0, "content_block": shell},
                    "content_block_start",
                )
            )
            arguments = orjson.dumps(TOOL_ARGUMENTS).decode()
            for piece in (arguments[:6], arguments[6:]):
                delta = {"type": "input_json_delta", "partial_json": piece}
                events.append(
                    _sse(
                        {"type": "content_block_delta", "index": 0, "delta": delta},
                        "content_block_delta",
                    )
                )
        else:
            events.append(
                _sse(
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
                    _sse(
                        {"type": "content_block_delta", "index": 0, "delta": delta},
                        "content_block_delta",
                    )
                )
        events.append(_sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        events.append(
            _sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": output},
                },
                "message_delta",
            )
        )
        events.append(_sse({"type": "message_stop"}, "message_stop"))
        return await _stream(request, events)


class NativeFleet:
    """Several native upstreams on one background loop; a context manager."""

    def __init__(self, *upstreams: NativeUpstream) -> None:
        self.upstreams = {upstream.name: upstream for upstream in upstreams}
        self._loop = BackgroundLoop()

    def __getitem__(self, name: str) -> Any:
        return self.upstreams[name]

    def __enter__(self) -> NativeFleet:
        self._loop.__enter__()
        for upstream in self.upstreams.values():
            self._loop.run(upstream.start())
        return self

    def __exit__(self, *exc: object) -> None:
        for upstream in self.upstreams.values():
            self._loop.run(upstream.stop())
        self._loop.__exit__(*exc)

    def reset(self) -> None:
        for upstream in self.upstreams.values():
            upstream.reset()
