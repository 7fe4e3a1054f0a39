"""The online engine: the step loop runs in its own thread; asyncio callers stream deltas.

Adds, aborts and stop-string finishes travel to the engine thread through a queue. The
engine thread does only the step (`LLMEngine.step_core`): the steps' raw tokens go to
every event loop that has streams with one `loop.call_soon_threadsafe`, and the output
processor runs there, on the consumer's side (detokenization, stop strings, deltas), as
vLLM's front end does. So nothing on the asyncio side waits on a model step, and the
step thread never pays for text. Only the engine thread touches the `LLMEngine`.

Steps are handed over in batches when they come faster than `PUBLISH_INTERVAL_S` (a host
bound engine: small model, fast device): at most one hand-over per interval, and always
before the step thread waits (on the device, or for work). Each stream then wakes once
per batch instead of once per step, which is most of the event loop's cost per step; the
outputs are the same, one per token.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.config import EngineConfig
from engine.core.host_placement import HostThreads, PlacementReport
from engine.core.llm_engine import LLMEngine
from engine.core.output_processor import StepOutput, process_steps
from engine.core.request_state import RequestState, StreamOutput
from engine.errors import EngineDeadError, EngineNotRunningError, EngineStepError
from engine.sampling import SamplingParams
from engine.structured.spec import StructuredOutput

if TYPE_CHECKING:
    import torch

    from engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# While steps keep coming faster than this, their outputs reach the event loops together.
PUBLISH_INTERVAL_S = 0.002

__all__ = [
    "AsyncEngine",
    "EngineDeadError",
    "EngineNotRunningError",
    "EngineStepError",
    "StreamOutput",
]


class _Outbox:
    """A stream's pending outputs, put and taken on its own event loop only.

    Lighter than `asyncio.Queue` (no size limit to police), and `take` hands over
    everything that piled up at once, so a consumer that fell behind catches up in one go.
    """

    __slots__ = ("_items", "_loop", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: list[list[StreamOutput] | BaseException] = []
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: list[StreamOutput] | BaseException) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self) -> list[list[StreamOutput] | BaseException]:
        while not self._items:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items, self._items = self._items, []
        return items


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    outbox: _Outbox
    state: RequestState


@dataclass
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams


@dataclass
class _Abort:
    request_id: str
    done: concurrent.futures.Future[bool] | None


@dataclass
class _StopSample:
    """A stop string ended one sample: the engine stops its sequence."""

    request_id: str
    index: int


@dataclass(frozen=True)
class LoopTrace:
    """One step-loop iteration, for the host benchmark: wall and CPU seconds."""

    step: int  # the engine's step number (`StepRecord.step`)
    wall_s: float  # schedule .. outputs handed off, on the step thread
    thread_cpu_s: float  # the step thread's CPU time in that span
    process_cpu_s: float  # the process's CPU clock (every thread) when the step ended


class AsyncEngine:
    def __init__(
        self,
        config: EngineConfig,
        progress: bool = False,
        engine: LLMEngine | None = None,
        trace_steps: bool = False,
    ) -> None:
        """`engine` replaces the one built from `config`; `trace_steps` keeps `loop_trace`."""
        self.engine = engine or LLMEngine(config, progress=progress)
        self._host_mode = config.host_threads
        self._host_threads: HostThreads | None = None
        self.loop_trace: list[LoopTrace] | None = [] if trace_steps else None
        self._commands: queue.SimpleQueue[_Add | _Abort | _StopSample | None] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._streams_lock = threading.Lock()
        # the request states of each event loop, touched only on that loop
        self._loop_states: dict[asyncio.AbstractEventLoop, dict[str, RequestState]] = {}
        self._loops: tuple[asyncio.AbstractEventLoop, ...] = ()  # read by the engine thread
        self._pending_adds = 0
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._dead: EngineDeadError | None = None  # set once; the engine never serves again
        self._unpublished: list[StepOutput] = []  # steps not yet handed to the event loops
        self._published_at = 0.0  # time.perf_counter() of the last hand-over

    # --- lifecycle ---------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def healthy(self) -> bool:
        """Running and able to serve: False once a tensor-parallel rank has died."""
        return self.is_running and self._dead is None and self.engine.healthy

    @property
    def dead_reason(self) -> str | None:
        """Why the engine is dead (a rank died or failed), or None."""
        if self._dead is not None:
            return str(self._dead)
        error = getattr(self.engine.runner, "error", None)
        return None if error is None else str(error)

    def start(self) -> None:
        if self.is_running:
            return
        self._stopping.clear()
        runner = self.engine.runner
        math_on_host = self.device.type == "cpu" and getattr(runner, "weight_bytes", 1) > 0
        self._host_threads = HostThreads(self._host_mode, math_on_host)
        self._thread = threading.Thread(target=self._run, name="engine-step-loop", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        self._stopping.set()
        self._commands.put(None)
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._host_threads is not None:
            self._host_threads.release()
        with self._streams_lock:
            streams = list(self._streams.items())
        for _, stream in streams:
            self._send(stream, EngineNotRunningError("the engine was shut down"))
        self.engine.shutdown()

    @property
    def host_placement(self) -> PlacementReport | None:
        """Where the step thread runs beside the event loop, and the timings behind it."""
        return None if self._host_threads is None else self._host_threads.report

    # --- the loaded model, as a front end needs it ---------------------------------------

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        """The longest sequence (prompt and output) the engine takes."""
        return self.engine.max_model_len

    @property
    def sampling_defaults(self) -> dict[str, Any]:
        """The checkpoint's recommended sampling (``SamplingParams`` fields) for requests that
        set none of it: its generation_config.json, or the bundled model's card."""
        return self.engine.sampling_defaults

    @property
    def device(self) -> torch.device:
        """Where the model runs (rank 0's device under tensor parallelism)."""
        return self.engine.device

    def check_request(self, prompt: str | list[int], params: SamplingParams) -> list[int]:
        """The prompt's token ids, or the error ``generate`` would raise for this request (too
        long for the context, a token id or ``logit_bias`` past the vocabulary, ``n`` above
        ``max_num_seqs``), without queueing it."""
        return self.engine.check_request(prompt, params)

    # --- public API --------------------------------------------------------------------

    async def generate(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
    ) -> AsyncIterator[StreamOutput]:
        """Stream the request's outputs; a request that can never fit raises at once."""
        if not self.is_running:
            raise EngineNotRunningError("the engine is not running: call start() first")
        params = params or SamplingParams()
        self._raise_if_dead()
        if params.structured is not None:
            await self.compile_structured(params.structured)
        token_ids = self.check_request(prompt, params)
        loop = asyncio.get_running_loop()
        text = prompt if isinstance(prompt, str) else None
        state = RequestState(request_id, text, token_ids, params, self.engine.tokenizer)
        stream = _Stream(loop, _Outbox(loop), state)
        state.sink = stream.outbox.put
        with self._streams_lock:
            self._raise_if_dead()  # under the lock: `_die` cannot miss this stream
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in use")
            self._streams[request_id] = stream
            self._pending_adds += 1
            states = self._loop_states.get(loop)
            if states is None:
                states = self._loop_states[loop] = {}
                self._loops = tuple(self._loop_states)
                if self._host_threads is not None:
                    self._host_threads.note_loop_thread()
            states[request_id] = state
        self._commands.put(_Add(request_id, token_ids, params))
        self._wake.set()
        finished = False
        try:
            while not finished:
                for item in await stream.outbox.take():
                    if isinstance(item, BaseException):
                        finished = True
                        raise item
                    for output in item:
                        finished = output.finished
                        yield output
        finally:
            with self._streams_lock:
                self._streams.pop(request_id, None)
                states = self._loop_states.get(loop)
                if states is not None:
                    states.pop(request_id, None)
                    if not states:
                        del self._loop_states[loop]
                        self._loops = tuple(self._loop_states)
            if not finished:  # the consumer went away (cancelled, broke out): free at once
                self._commands.put(_Abort(request_id, None))
                self._wake.set()

    async def compile_structured(self, spec: StructuredOutput) -> None:
        """Compile a structured-output spec in a worker thread (cached: once per spec), so
        neither the caller's event loop nor the step thread compiles; `GrammarError` if the
        spec cannot be compiled."""
        grammars = self.engine.grammars
        if grammars.cached(spec) is None:
            await asyncio.to_thread(grammars.compile, spec)

    def _raise_if_dead(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(f"the engine is dead: {self._dead}")
        if not self.engine.healthy:  # a rank died while the engine was idle
            error = getattr(self.engine.runner, "error", None)
            raise EngineDeadError(f"the engine is dead: {error or 'a worker is gone'}")

    async def abort(self, request_id: str) -> bool:
        """Abort a request; returns once its blocks are free (False if it was unknown)."""
        done: concurrent.futures.Future[bool] = concurrent.futures.Future()
        self._commands.put(_Abort(request_id, done))
        self._wake.set()
        if not self.is_running:
            return False
        return await asyncio.wrap_future(done)

    def load(self) -> dict[str, Any]:
        """What a load-aware router needs: queue depth, running count, KV usage."""
        snap = self.engine.stats.snapshot()
        return {
            "num_requests_waiting": snap["num_requests_waiting"] + self._pending_adds,
            "num_requests_running": snap["num_requests_running"],
            "kv_cache_usage_perc": snap["kv_cache_usage_perc"],
        }

    def stats(self) -> dict[str, Any]:
        snap = self.engine.stats.snapshot()
        snap["num_requests_waiting"] += self._pending_adds
        return snap

    # --- the engine thread -------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        host_threads = self._host_threads
        while not self._stopping.is_set():
            self._wake.clear()
            self._drain_commands()
            if not engine.has_unfinished_requests():
                self._publish()
                self._wake.wait()
                continue
            began, began_cpu, steps = (
                time.perf_counter(),
                time.thread_time(),
                engine.stats.num_steps,
            )
            try:
                out = engine.step_core(before_wait=self._publish)
            except EngineDeadError as exc:  # a rank is gone: nothing can be served again
                self._die(exc)
                continue
            except Exception as exc:  # keep serving: fail what was in flight, carry on
                log.exception("engine step failed")
                self._fail_all(EngineStepError(f"engine step failed: {exc}"))
                continue
            if out is not None and out.seqs:
                self._unpublished.append(out)
            if time.perf_counter() - self._published_at >= PUBLISH_INTERVAL_S:
                self._publish()
            if host_threads is not None and engine.stats.num_steps > steps:
                decode_only = engine.stats.steps[-1].num_prefill_seqs == 0
                host_threads.after_step(decode_only, len(out.seqs) if out is not None else 0)
            if self.loop_trace is not None and engine.stats.num_steps > steps:
                self.loop_trace.append(
                    LoopTrace(
                        step=steps,
                        wall_s=time.perf_counter() - began,
                        thread_cpu_s=time.thread_time() - began_cpu,
                        process_cpu_s=time.process_time(),
                    )
                )
        self._fail_all(EngineNotRunningError("the engine was shut down"))

    def _publish(self) -> None:
        """Hand the steps made since the last call to every event loop with streams (one
        call each); the output processor runs over there."""
        self._published_at = time.perf_counter()
        if not self._unpublished:
            return
        outs, self._unpublished = self._unpublished, []
        for loop in self._loops:
            try:
                loop.call_soon_threadsafe(self._on_steps, loop, outs)
            except RuntimeError:  # that event loop is closed: its requests have no reader
                self._abort_loop(loop)

    def _on_steps(self, loop: asyncio.AbstractEventLoop, outs: list[StepOutput]) -> None:
        """On `loop`: detokenize, check stop strings and deliver this loop's deltas."""
        states = self._loop_states.get(loop)
        if not states:
            return
        results, stops = process_steps(outs, states, self.engine.stats)
        for state, outputs in results:
            if state.sink is not None:
                state.sink(outputs)
        if stops:
            for request_id, index in stops:
                self._commands.put(_StopSample(request_id, index))
            self._wake.set()

    def _abort_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._streams_lock:
            doomed = [rid for rid, stream in self._streams.items() if stream.loop is loop]
            self._loop_states.pop(loop, None)
            self._loops = tuple(self._loop_states)
        for request_id in doomed:
            self.engine.abort_request(request_id)

    def _drain_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Add):
                self._add(command)
            elif isinstance(command, _Abort):
                found = self.engine.abort_request(command.request_id)
                if command.done is not None:
                    command.done.set_result(found)
            elif isinstance(command, _StopSample):
                self.engine.finish_seq(command.request_id, command.index, "stop")

    def _add(self, command: _Add) -> None:
        with self._streams_lock:
            self._pending_adds -= 1
            stream = self._streams.get(command.request_id)
        if stream is None:
            return  # cancelled before it reached the engine
        if self._dead is not None:
            self._send(stream, EngineDeadError(f"the engine is dead: {self._dead}"))
            return
        try:
            self.engine.add_request(
                command.request_id, command.prompt, command.params, track_output=False
            )
        except ValueError as exc:
            self._send(stream, exc)

    def _die(self, error: EngineDeadError) -> None:
        """Fail everything in flight; the loop stays up only to refuse and abort."""
        log.error("engine is dead: %s", error)
        with self._streams_lock:
            self._dead = error
        self._fail_all(error)

    def _fail_all(self, error: Exception) -> None:
        self._publish()  # the tokens made so far reach their streams before the error
        for request_id in list(self.engine.requests):
            self.engine.abort_request(request_id)
        with self._streams_lock:
            streams = list(self._streams.values())
        for stream in streams:
            self._send(stream, error)

    @staticmethod
    def _send(stream: _Stream, item: BaseException) -> bool:
        try:
            stream.loop.call_soon_threadsafe(stream.outbox.put, item)
        except RuntimeError:  # the caller's event loop is closed
            return False
        return True
