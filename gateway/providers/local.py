"""The in-process engine as a provider: the same interface as the OpenAI-compatible upstreams.

Chat requests arrive parsed (``post_chat(request)``, ``open_chat_stream(request)``: the
internal form ``formats/`` read the client's body into, whatever its format), text
completions as their body (``post_json("/completions", body)``); answers are Chat
Completions' (or Completions') JSON, streams an object whose ``batches()`` yields raw SSE
``data`` payloads (``[DONE]`` last; an engine output's chunks together) and whose ``close()``
stops the generation; so the request path, limits, usage records and retries treat the local
model exactly like a remote one. Each prompt runs as one engine request; cancelling the
consumer (a client disconnect) cancels the producers, which aborts the engine requests and
frees their KV blocks at once. A whole answer's call also takes ``client_gone`` (the ASGI
``receive``): a non-stream client that hangs up is noticed while the engine works, not only at
the end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Unpack

import orjson

from gateway.errors import UpstreamError
from gateway.formats import openai_chat
from gateway.formats.errors import FormatError
from gateway.formats.internal import ChatRequest
from gateway.policy import LocalEngineSettings
from gateway.providers.base import (
    ClientGone,
    Headers,
    JsonCallOptions,
    UpstreamResponse,
    refused_request,
)
from gateway.providers.local_openai import (
    Choice,
    EngineLimits,
    LocalRequest,
    chat_request,
    chunk,
    client_error,
    completion_request,
    delta_choice,
    full_response,
    tool_call_deltas,
    tool_finish,
    usage,
)
from gateway.providers.local_tools import default_parser
from gateway.tracing.spans import EnginePhases

if TYPE_CHECKING:
    from engine import AsyncEngine, StreamOutput
    from gateway.metrics import Metrics

# max_tokens of a request that sets none, when neither the policy nor the checkpoint says:
# on the CPU a small model makes ~10-20 tokens a second, so an answer ends within ~20 s.
CPU_DEFAULT_MAX_TOKENS = 256
CUDA_DEFAULT_MAX_TOKENS = 1024


def default_max_tokens(settings: LocalEngineSettings, checkpoint: int | None, device: str) -> int:
    """The policy's ``default_max_tokens``, else the checkpoint's ``max_new_tokens``, else by
    device."""
    if settings.default_max_tokens is not None:
        return settings.default_max_tokens
    if checkpoint is not None:
        return checkpoint
    return CUDA_DEFAULT_MAX_TOKENS if device == "cuda" else CPU_DEFAULT_MAX_TOKENS


_END = object()  # a producer finished


class LocalProvider:
    """The engine's side of the local provider: a chat or text completion run on the engine,
    answered as JSON or streamed. The registry's ``Provider`` is ``local_host.HostedProvider``,
    which owns what does not need the engine (formats, availability, errors, other operations)
    and sends these two calls here once the engine is loaded."""

    def __init__(
        self,
        name: str,
        engine: AsyncEngine,
        settings: LocalEngineSettings,
        metrics: Metrics | None,
    ) -> None:
        self.name = name
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.tokenizer = engine.tokenizer
        # The checkpoint's recommended sampling (generation_config.json, or the bundled
        # model's card), for requests that set none of it.
        self.sampling_defaults = dict(engine.sampling_defaults)
        self.default_max_tokens = default_max_tokens(
            settings, self.sampling_defaults.pop("max_tokens", None), engine.device.type
        )
        # how this model writes tool calls: the policy's choice, else its family's
        parser = settings.tool_call_parser
        template = getattr(self.tokenizer, "chat_template", None)
        self.tool_parser = default_parser(template) if parser == "auto" else parser
        self.limits = EngineLimits(
            engine.max_model_len,
            self.default_max_tokens,
            self.sampling_defaults,
            self.tool_parser,
        )

    def _prepare(self, path: str, body: dict[str, Any]) -> LocalRequest:
        """A body for ``path``: a text completion's, or a chat request's (parsed by
        ``formats/``, as the gateway hands it over parsed: ``post_chat``)."""
        if path == "/completions":
            return self._checked(completion_request(self.name, body, self.tokenizer, self.limits))
        if path == "/chat/completions":
            try:
                request = openai_chat.parse_request(body)
            except FormatError as exc:
                raise refused_request(exc, self.name, "status") from None
            return self._prepare_chat(request)
        raise client_error(
            self.name,
            f"the model {body.get('model')!r} is a local text-generation model served by "
            f"the in-process engine; it does not serve /v1{path}",
            "model",
            "unsupported_endpoint",
        )

    def _prepare_chat(self, request: ChatRequest) -> LocalRequest:
        return self._checked(chat_request(self.name, request, self.tokenizer, self.limits))

    def _checked(self, request: LocalRequest) -> LocalRequest:
        """Each prompt and the sampling checked against the engine (its context length, its
        vocabulary, its seats)."""
        from engine import InvalidPromptError, RequestTooLargeError, SamplingParamsError

        param = "messages" if request.kind == "chat" else "prompt"
        for prompt in request.prompts:
            try:
                self.engine.check_request(prompt, request.params)
            except RequestTooLargeError as exc:
                raise client_error(self.name, str(exc), param, "context_length_exceeded") from None
            except InvalidPromptError as exc:
                raise client_error(self.name, str(exc), param) from None
            except SamplingParamsError as exc:  # n beyond max_num_seqs, a token id past the vocab
                param = "logit_bias" if str(exc).startswith("logit_bias") else "n"
                raise client_error(self.name, str(exc), param) from None
        return request

    async def _compile(self, request: LocalRequest) -> None:
        """A structured output's grammar and the offered tools' parameter schemas, compiled in
        a worker thread (never on this event loop; cached by the engine, so once per spec);
        one that cannot be compiled is a 400 naming the field that set it."""
        from engine import GrammarError

        for spec, param in request.compile:
            try:
                await self.engine.compile_structured(spec)
            except GrammarError as exc:
                raise client_error(self.name, str(exc), param) from None

    async def post_chat(
        self, request: ChatRequest, *, client_gone: ClientGone | None = None
    ) -> UpstreamResponse:
        """A chat request's whole answer (Chat Completions' shape); see ``post_json``."""
        return await self._answer(self._prepare_chat(request), client_gone)

    async def open_chat_stream(self, request: ChatRequest) -> LocalStream:
        """A chat request's stream (Chat Completions' chunks, usage last)."""
        local = self._prepare_chat(request)
        await self._compile(local)
        return LocalStream(self, local, include_usage=True)

    async def post_json(
        self, path: str, body: dict[str, Any], **options: Unpack[JsonCallOptions]
    ) -> UpstreamResponse:
        """The whole answer. ``client_gone`` resolves when the client disconnects (the ASGI
        ``receive`` once the body is read): the engine requests are then aborted at once,
        freeing their KV blocks, and a 499 ``client_closed_request`` error is raised."""
        return await self._answer(self._prepare(path, body), options.get("client_gone"))

    async def _answer(
        self, request: LocalRequest, client_gone: ClientGone | None
    ) -> UpstreamResponse:
        await self._compile(request)
        run = LocalRun(self, request)
        choices = [Choice() for _ in range(len(request.prompts) * request.n)]
        gathering = asyncio.ensure_future(_gather(run, choices))
        watching = asyncio.ensure_future(_disconnect(client_gone)) if client_gone else None
        try:
            waited = {gathering} if watching is None else {gathering, watching}
            await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
            if not gathering.done():
                raise UpstreamError(
                    "the client closed the request; the local engine aborted it",
                    status=499,
                    retryable=False,
                    kind="status",  # a client outcome: no retry, no fallback, no breaker
                    provider=self.name,
                    code="client_closed_request",
                )
            gathering.result()
        finally:
            for task in (gathering, watching):
                if task is not None and not task.done():
                    task.cancel()
            run.close()
        data = full_response(request, self.tokenizer, choices, run.prompt_tokens)
        raw = orjson.dumps(data)
        return UpstreamResponse(200, raw, data, phases=run.phases())

    async def open_stream(
        self, path: str, body: dict[str, Any], *, headers: Headers | None = None
    ) -> LocalStream:
        request = self._prepare(path, body)
        await self._compile(request)
        options = body.get("stream_options") or {}
        return LocalStream(self, request, include_usage=options.get("include_usage") is True)


async def _gather(run: LocalRun, choices: list[Choice]) -> None:
    async for output, index in run.outputs():
        choice = choices[index]
        choice.text += output.text
        choice.num_tokens = output.num_output_tokens
        if output.logprobs:
            choice.logprobs.extend(output.logprobs)
        if output.finish_reason is not None:
            choice.finish_reason = output.finish_reason


async def _disconnect(receive: ClientGone) -> None:
    """Returns when ASGI says the client is gone (after the body nothing else arrives)."""
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return


class LocalRun:
    """One OpenAI request on the engine: a producer task per prompt, outputs merged in order."""

    def __init__(self, provider: LocalProvider, request: LocalRequest) -> None:
        self.provider = provider
        self.request = request
        self.prompt_tokens = sum(len(p) for p in request.prompts)
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = time.perf_counter()
        # The engine's clock (time.monotonic) for the trace's phases: queued, prefill began
        # (the earliest sample's), first token, last token.
        self._timeline = EnginePhases(queued_at=time.monotonic(), prompt_tokens=self.prompt_tokens)
        self._output_tokens: dict[int, int] = {}

    async def outputs(self) -> AsyncIterator[tuple[StreamOutput, int]]:
        """(output, choice index) pairs until every prompt is done; engine errors raise."""
        engine = self.provider.engine
        for number, prompt in enumerate(self.request.prompts):
            request_id = f"{self.request.response_id}-{number}"
            coroutine = self._produce(engine, request_id, number, prompt)
            self._tasks.append(asyncio.create_task(coroutine))
        metrics = self.provider.metrics
        first_seen = False
        last_at: dict[int, float] = {}
        remaining = len(self._tasks)
        while remaining:
            item = await self._queue.get()
            if item is _END:
                remaining -= 1
                continue
            if isinstance(item, BaseException):
                raise self._upstream_error(item)
            number, output = item
            now = time.perf_counter()
            index = number * self.request.n + output.index
            self._note_phase(output, index)
            if metrics is not None and output.token_ids:
                if not first_seen:
                    metrics.engine_ttft.observe(now - self._started)
                elif index in last_at:
                    metrics.engine_itl.observe((now - last_at[index]) / len(output.token_ids))
                first_seen = True
                last_at[index] = now
            yield output, index
        if metrics is not None:
            metrics.engine_e2e.observe(time.perf_counter() - self._started)

    def _note_phase(self, output: StreamOutput, index: int) -> None:
        timeline, scheduled, at = self._timeline, output.scheduled_at, output.step_time
        if scheduled is not None and (
            timeline.scheduled_at is None or scheduled < timeline.scheduled_at
        ):
            timeline.scheduled_at = scheduled
        if at is not None:
            if timeline.first_token_at is None:
                timeline.first_token_at = at
            timeline.finished_at = at
        self._output_tokens[index] = output.num_output_tokens

    def phases(self) -> EnginePhases:
        """Where the engine spent this request's time (span events of its trace): a copy, as
        the run goes on filling in its own."""
        return dataclasses.replace(self._timeline, output_tokens=sum(self._output_tokens.values()))

    async def _produce(
        self, engine: AsyncEngine, request_id: str, number: int, prompt: list[int]
    ) -> None:
        try:
            async for output in engine.generate(request_id, prompt, self.request.params):
                self._queue.put_nowait((number, output))
        except asyncio.CancelledError:
            raise  # generate()'s own cleanup has aborted the engine request
        except Exception as exc:
            self._queue.put_nowait(exc)
        self._queue.put_nowait(_END)

    def _upstream_error(self, exc: BaseException) -> UpstreamError:
        from engine import EngineDeadError, EngineNotRunningError

        name = self.provider.name
        if isinstance(exc, EngineDeadError | EngineNotRunningError):
            return UpstreamError(
                f"local engine unavailable: {exc}", status=503, kind="protocol", provider=name
            )
        return UpstreamError(
            f"local engine failed: {exc}", status=502, kind="protocol", provider=name
        )

    def close(self) -> None:
        """Cancel what still runs: the engine aborts those requests and frees their blocks."""
        for task in self._tasks:
            if not task.done():
                task.cancel()


class LocalStream:
    """OpenAI SSE chunks from the engine: role deltas, content deltas, finish, usage."""

    route_note: str | None = None

    def __init__(self, provider: LocalProvider, request: LocalRequest, include_usage: bool):
        self.provider = provider
        self.request = request
        self.include_usage = include_usage
        self.run = LocalRun(provider, request)

    async def batches(self) -> AsyncIterator[list[bytes]]:
        """The chunks of each engine output together, then the usage chunk and ``[DONE]``."""
        request, tokenizer = self.request, self.provider.tokenizer
        count = len(request.prompts) * request.n
        tokens = [0] * count
        plan = request.tools
        readers = [plan.parser.stream() for _ in range(count)] if plan is not None else []
        try:
            if request.kind == "chat":
                roles = [
                    delta_choice(request, tokenizer, i, "", None, None, role=True)
                    for i in range(count)
                ]
                yield [orjson.dumps(chunk(request, roles))]
            async for output, index in self.run.outputs():
                tokens[index] = output.num_output_tokens
                rows = []
                if readers:
                    pieces = readers[index].feed(output.text)
                    if output.finish_reason is not None:
                        pieces += readers[index].finish()
                    rows = self._tool_rows(index, pieces, readers[index], output.logprobs)
                elif output.text or output.logprobs:
                    rows = [
                        delta_choice(request, tokenizer, index, output.text, output.logprobs, None)
                    ]
                if output.finish_reason is not None:
                    finish = "stop" if output.finish_reason == "stop" else "length"
                    if readers and readers[index].calls:
                        finish = tool_finish(output.finish_reason)
                    rows.append(delta_choice(request, tokenizer, index, "", None, finish))
                if rows:
                    yield [orjson.dumps(chunk(request, [row])) for row in rows]
            last = [b"[DONE]"]
            if self.include_usage:
                totals = usage(self.run.prompt_tokens, sum(tokens))
                last.insert(0, orjson.dumps(chunk(request, [], usage=totals)))
            yield last
        finally:
            self.run.close()

    def _tool_rows(
        self, index: int, pieces: list[Any], reader: Any, logprobs: list[Any] | None
    ) -> list[dict[str, Any]]:
        """Content and ``tool_calls`` deltas of one output; the text of a call never goes out
        as content. The output's logprobs ride on its first row (a row of their own if the
        parser holds all of its text back)."""
        request, tokenizer = self.request, self.provider.tokenizer
        rows = []
        number = reader.calls - sum(piece.call is not None for piece in pieces)
        for piece in pieces:
            if piece.call is None:
                rows.append(delta_choice(request, tokenizer, index, piece.content, None, None))
                continue
            for delta in tool_call_deltas(number, piece.call):
                rows.append(
                    delta_choice(request, tokenizer, index, "", None, None, tool_call=delta)
                )
            number += 1
        if logprobs:
            if rows:
                first = delta_choice(request, tokenizer, index, "", logprobs, None)
                rows[0]["logprobs"] = first["logprobs"]
            else:
                rows.append(delta_choice(request, tokenizer, index, "", logprobs, None))
        return rows

    def close(self) -> None:
        self.run.close()

    def phases(self) -> EnginePhases:
        """The engine's queue, prefill and decode so far (read when the stream ends)."""
        return self.run.phases()
