"""OpenAI and Azure OpenAI, as loopback upstreams that check what they receive (see
``native_upstreams``): OpenAI's ``/v1`` API (chat completions and the Responses API in JSON and
SSE, embeddings, moderations, audio, image edits, and the Files and Batch API: a batch ends after
a poll or two, ``native_batches``) and Azure's deployment paths with ``api-version`` and
``api-key``."""

from __future__ import annotations

import time
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
    form_fields,
    sse,
    stream_events,
    text_of,
    wants_tool,
)


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
                last_text, tool_result = text_of(content), None
            elif message.get("role") == "tool":
                tool_result = text_of(content)
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
            return sse({**head, "object": "chat.completion.chunk", "choices": [choice]})

        events = []
        if self.leading_filter_chunk:
            events.append(
                sse(
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
                sse({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage})
            )
        events.append(b"data: [DONE]\n\n")
        return await stream_events(request, events)

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
        form = form_fields(seen)
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
        form = form_fields(seen)
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


class FakeOpenAI(OpenAIStyle):
    def __init__(self, name: str, key: str) -> None:
        super().__init__(name, key)
        self.batches = BatchQueue("batch_")
        self.files: dict[str, bytes] = {}
        self.batch_files: dict[str, tuple[str | None, str | None]] = {}  # output, error
        # The next this many batch creations are made but answered 500: the answer lost on
        # the way, as a timeout after the provider accepted would lose it.
        self.lose_create_answers = 0
        # An OpenAI-compatible server without the Files and Batch API (vLLM's): a 404.
        self.without_batch_api = False

    def reset(self) -> None:
        super().reset()
        self.batches.reset()
        self.lose_create_answers = 0
        self.without_batch_api = False

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
        app.router.add_post("/v1/files", self.upload)
        app.router.add_get("/v1/files/{file_id}/content", self.file_content)
        app.router.add_post("/v1/batches", self.create_batch)
        app.router.add_get("/v1/batches", self.list_batches)
        app.router.add_get("/v1/batches/{batch_id}", self.get_batch)
        app.router.add_post("/v1/batches/{batch_id}/cancel", self.cancel_batch)

    # -- the Files and Batch API -----------------------------------------------------------

    def _file(self, data: bytes, purpose: str, filename: str) -> dict[str, Any]:
        file_id = f"file-{len(self.files) + 1:06d}"
        self.files[file_id] = data
        return {
            "id": file_id,
            "object": "file",
            "bytes": len(data),
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
        }

    async def upload(self, request: web.Request) -> web.Response:
        seen, refused = await self._receive(request)
        if refused:
            return self.openai_error(401, refused)
        if self.without_batch_api:
            return self.openai_error(404, "Invalid URL (POST /v1/files)")
        form = form_fields(seen)
        if form.get("purpose") != "batch" or not isinstance(form.get("file"), bytes):
            return self.openai_error(400, "purpose must be batch, with a file")
        return web.json_response(self._file(form["file"], "batch", "input.jsonl"))

    async def file_content(self, request: web.Request) -> web.Response:
        _, refused = await self._receive(request)
        if refused:
            return self.openai_error(401, refused)
        data = self.files.get(request.match_info["file_id"])
        if data is None:
            return self.openai_error(404, "No such File object")
        return web.Response(body=data, content_type="application/octet-stream")

    async def create_batch(self, request: web.Request) -> web.Response:
        seen, refused = await self._receive(request)
        if refused:
            return self.openai_error(401, refused)
        body = seen.body
        data = self.files.get(body.get("input_file_id"))
        endpoint = body.get("endpoint")
        if data is None or body.get("completion_window") != "24h":
            return self.openai_error(400, "input_file_id and completion_window 24h are required")
        requests = []
        for raw in data.splitlines():
            line = orjson.loads(raw)
            if line.get("method") != "POST" or line.get("url") != endpoint:
                return self.openai_error(400, f"line {line.get('custom_id')}: not {endpoint}")
            requests.append((line["custom_id"], {"url": endpoint, "body": line["body"]}))
        batch = self.batches.submit(requests, body.get("metadata"))
        if self.lose_create_answers > 0:
            self.lose_create_answers -= 1
            return web.json_response({"error": {"message": "upstream timed out"}}, status=500)
        return web.json_response(self.batch_view(batch, endpoint, body["input_file_id"]))

    def batch_view(self, batch: FakeBatch, endpoint: str, input_file_id: str) -> dict[str, Any]:
        if batch.status == "running":
            status = "in_progress" if batch.looks else "validating"
        else:
            status = batch.status if batch.status == "cancelling" else batch.ended_as
        output_id, error_id = self.batch_files.get(batch.id, (None, None))
        answered = [r for r in batch.results if r.outcome == "answered"]
        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": endpoint,
            "input_file_id": input_file_id,
            "completion_window": "24h",
            "status": status,
            "output_file_id": output_id,
            "error_file_id": error_id,
            "created_at": batch.created_at,
            "request_counts": {
                "total": len(batch.requests),
                "completed": sum(1 for r in answered if r.status < 400),
                "failed": sum(1 for r in answered if r.status >= 400),
            },
            "metadata": batch.metadata,
        }

    async def list_batches(self, request: web.Request) -> web.Response:
        _, refused = await self._receive(request)
        if refused:
            return self.openai_error(401, refused)
        batches = self.batches.newest_first()
        after = request.query.get("after")
        if after is not None:
            ids = [batch.id for batch in batches]
            batches = batches[ids.index(after) + 1 :] if after in ids else []
        limit = int(request.query.get("limit", "20"))
        page = [self.batch_view(batch, "", "") for batch in batches[:limit]]
        return web.json_response({"object": "list", "data": page, "has_more": len(batches) > limit})

    async def get_batch(self, request: web.Request) -> web.Response:
        _, refused = await self._receive(request)
        if refused:
            return self.openai_error(401, refused)

        async def run(item: dict[str, Any]) -> tuple[int, Any]:
            headers = {"authorization": f"Bearer {self.key}"}
            url = self.origin + item["url"]
            async with (
                aiohttp.ClientSession() as session,
                session.post(url, json=item["body"], headers=headers) as reply,
            ):
                return reply.status, await reply.json(content_type=None)

        batch = await self.batches.look(request.match_info["batch_id"], run)
        if batch is None:
            return self.openai_error(404, "No such batch")
        if batch.status == "ended" and batch.id not in self.batch_files:
            self.batch_files[batch.id] = self._result_files(batch)
        return web.json_response(self.batch_view(batch, "", ""))

    def _result_files(self, batch: FakeBatch) -> tuple[str | None, str | None]:
        """OpenAI's output file (2xx answers) and error file (the others, and requests the
        batch never ran: ``batch_cancelled``, ``batch_expired``)."""
        output, errors = [], []
        for number, result in enumerate(batch.results):
            line: dict[str, Any] = {"id": f"batch_req_{number}", "custom_id": result.custom_id}
            if result.outcome == "answered":
                line["response"] = {
                    "status_code": result.status,
                    "request_id": f"req_{number}",
                    "body": result.body,
                }
                line["error"] = None
                (output if result.status < 400 else errors).append(line)
            else:
                code = f"batch_{result.outcome}"
                line["response"] = None
                line["error"] = {"code": code, "message": f"This request was {result.outcome}."}
                errors.append(line)

        def stored(lines: list[dict[str, Any]]) -> str | None:
            if not lines:
                return None
            data = b"".join(orjson.dumps(line) + b"\n" for line in lines)
            return str(self._file(data, "batch_output", "results.jsonl")["id"])

        return stored(output), stored(errors)

    async def cancel_batch(self, request: web.Request) -> web.Response:
        _, refused = await self._receive(request)
        if refused:
            return self.openai_error(401, refused)
        batch = self.batches.cancel(request.match_info["batch_id"])
        if batch is None:
            return self.openai_error(404, "No such batch")
        return web.json_response(self.batch_view(batch, "", ""))

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
                last_text, tool_result = text_of(content), None
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
            return sse({"type": kind, "sequence_number": next(sequence), **fields}, kind)

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
        return await stream_events(request, events)


class FakeAzure(OpenAIStyle):
    """Azure OpenAI: ``deployments`` maps a deployment name to the model it runs."""

    cached_tokens = 0
    leading_filter_chunk = True

    def __init__(self, name: str, key: str, api_version: str) -> None:
        super().__init__(name, key)
        self.api_version = api_version

    @property
    def url(self) -> str:  # an Azure resource endpoint has no /v1
        return self.origin

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
        app.router.add_post(prefix + "/audio/translations", self._deployed(self.transcription))

    def _deployed(self, handler: Any) -> Any:
        async def route(request: web.Request) -> web.StreamResponse:
            return await handler(request, request.match_info["deployment"])

        return route


class FakeEngineReplica(FakeOpenAI):
    """An engine replica of a ``kind: engine_fleet`` provider, as vLLM serves one: OpenAI's API
    under ``/v1`` (checked and booked as ``FakeOpenAI``'s, no cached tokens) and its
    Prometheus ``/metrics`` (an idle engine), which the fleet scrapes. ``replica`` is the URL
    the policy lists (``scheme://host:port``, no path)."""

    cached_tokens = 0

    @property
    def replica(self) -> str:
        return self.origin

    def add_routes(self, app: web.Application) -> None:
        super().add_routes(app)
        app.router.add_get("/metrics", self.metrics)

    async def metrics(self, request: web.Request) -> web.Response:
        page = (
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{model_name="engine"} 0.0\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{model_name="engine"} 0.0\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:kv_cache_usage_perc{model_name="engine"} 0.0\n'
        )
        return web.Response(text=page, content_type="text/plain")
