"""The synchronous engine (`LLMEngine`: add requests, step) and the offline `LLM` API.

A step is split in two halves. `step_core` (the step thread's whole job) schedules,
builds the step's inputs from the persistent batch, launches the step, commits it and
appends the tokens of the step that completed, checking stop tokens, EOS and lengths; it
returns a `StepOutput`. Turning that into text and deltas (`core/output_processor.py`)
happens elsewhere: on the consumer's event loop under `AsyncEngine`, inline in `step`.
With asynchronous scheduling (a single CUDA rank by default) step N+1 is launched before
step N's tokens are read back, so the host prepares the next step while the GPU runs.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.distributed import TensorParallelExecutor
from engine.core.input_batch import InputBatch
from engine.core.model_runner import ModelRunner, StepHandle, StepResult
from engine.core.output_processor import RequestDelta, StepOutput, process_step
from engine.core.request_state import RequestState
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.sequence import Request, Sequence, SequenceStatus
from engine.core.stats import EngineStats, StepRecord
from engine.errors import ConfigError, InvalidPromptError, SamplingParamsError
from engine.generation_config import sampling_defaults
from engine.loader import resolve_model_path
from engine.sampling import SamplingParams, TokenLogprobs
from engine.structured.compiler import GrammarCompiler
from engine.tokenizer import Tokenizer


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort" | None while running
    logprobs: list[TokenLogprobs] | None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason


@dataclass
class _InFlight:
    """A launched step whose tokens have not been read back."""

    sampled: list[Sequence]
    handle: StepHandle


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        progress: bool = True,
        runner: ModelRunner | TensorParallelExecutor | None = None,
    ) -> None:
        """`runner` replaces the model runner built from `config` (the host benchmark's stub)."""
        self.config = config
        path = resolve_model_path(config.model, config.download_dir)
        self.tokenizer = Tokenizer(config.tokenizer or path)
        _ = self.tokenizer.token_bytes  # built now, not on the first request
        # what a request that sets no temperature, top_p, ... or max_tokens gets
        self.sampling_defaults = sampling_defaults(
            config.generation_config, path, config.override_generation_config
        )
        self.runner: ModelRunner | TensorParallelExecutor
        if runner is not None:
            self.runner = runner
        elif config.tensor_parallel_size > 1:
            self.runner = TensorParallelExecutor(config, path, progress=progress)
        else:
            self.runner = ModelRunner(config, path, progress=progress)
        args = self.runner.args
        self.eos_token_ids = self.tokenizer.eos_token_ids | frozenset(args.eos_token_id)
        # structured outputs: specs compiled once (cached), matched per sample on this thread
        self.grammars = GrammarCompiler(self.tokenizer, args.vocab_size, sorted(self.eos_token_ids))
        self.async_scheduling = self._resolve_async_scheduling()
        self._released_seq_ids: list[int] = []  # seeded sequences done since the last step
        self.max_model_len = self.runner.max_model_len
        self.block_manager = BlockManager(
            self.runner.num_blocks, config.block_size, config.enable_prefix_caching
        )
        self.stats = EngineStats()
        self.scheduler = Scheduler(config, self.max_model_len, self.block_manager, self.stats)
        self.input_batch = InputBatch(
            config.max_num_seqs,
            -(-self.max_model_len // config.block_size),
            config.block_size,
            self.eos_token_ids,
            args.vocab_size,
        )
        self.requests: dict[str, Request] = {}
        self._states: dict[str, RequestState] = {}  # the synchronous API's client views
        self._seq_ids = itertools.count()
        self._in_flight: _InFlight | None = None

    @property
    def device(self) -> torch.device:
        """Where the model runs (rank 0's device under tensor parallelism)."""
        return self.runner.device

    def _resolve_async_scheduling(self) -> bool:
        wanted = self.config.async_scheduling
        can = isinstance(self.runner, ModelRunner)
        if wanted and not can:
            raise ConfigError("async_scheduling needs tensor_parallel_size 1")
        if wanted is None:
            return can and self.runner.device.type == "cuda"
        return wanted

    # --- requests ----------------------------------------------------------------------

    def encode_prompt(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            token_ids = self.tokenizer.encode(prompt)
            text: str | None = prompt
        else:
            token_ids, text = list(prompt), None
        if not token_ids:
            raise InvalidPromptError("the prompt is empty: at least one token is required")
        vocab = self.runner.args.vocab_size
        bad = next((t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidPromptError(
                f"prompt token id {bad!r} is outside the vocabulary [0, {vocab})"
            )
        return text, token_ids

    def check_request(self, prompt: str | list[int], params: SamplingParams) -> list[int]:
        """Raise the error `add_request` would raise, without touching engine state."""
        _, token_ids = self.encode_prompt(prompt)
        self.scheduler.check_fits(len(token_ids), params)
        self._check_logit_bias(params)
        return token_ids

    def _check_logit_bias(self, params: SamplingParams) -> None:
        vocab = self.runner.args.vocab_size
        bad = next((t for t in params.logit_bias if t >= vocab), None)
        if bad is not None:
            raise SamplingParamsError(
                f"logit_bias token id {bad} is outside the vocabulary [0, {vocab})"
            )

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        track_output: bool = True,
    ) -> Request:
        """Queue a request. `track_output`: keep its text and deltas here, for `step` and
        `request_output`; `AsyncEngine` passes False and processes outputs itself."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        text, token_ids = self.encode_prompt(prompt)
        self.scheduler.check_fits(len(token_ids), params)
        self._check_logit_bias(params)
        request = Request(request_id, text, token_ids, params)
        if params.structured is not None:  # cached when the caller compiled it beforehand
            request.grammar = self.grammars.compile(params.structured)
        if track_output:
            request.state = RequestState(
                request_id, text, token_ids, params, self.tokenizer, request.arrival_time
            )
            self._states[request_id] = request.state
        self.requests[request_id] = request
        if params.n > 1 and len(token_ids) > 1:
            request.pending_forks = params.n - 1  # forked once the shared prompt is cached
            self.scheduler.add(self._new_seq(request, 0))
        else:
            for index in range(params.n):
                self.scheduler.add(self._new_seq(request, index))
        self.stats.record_tokens(prompt=len(token_ids), generated=0)
        return request

    def _new_seq(self, request: Request, index: int) -> Sequence:
        # a seeded sequence's generator lives with the sampler (in the runner, on rank 0)
        seq = Sequence(next(self._seq_ids), request, index, self.eos_token_ids)
        if request.grammar is not None:
            seq.grammar = self.grammars.matcher(request.grammar)
        request.seqs.append(seq)
        return seq

    def _fork(self, request: Request) -> None:
        parent = request.seqs[0]
        for index in range(1, request.pending_forks + 1):
            child = self._new_seq(request, index)
            self.block_manager.fork(parent, child)
            self.scheduler.add_running(child)
        request.pending_forks = 0

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its blocks; False if it is unknown or already done."""
        request = self.requests.pop(request_id, None)
        self._states.pop(request_id, None)
        if request is None:
            return False
        request.pending_forks = 0
        for seq in request.seqs:
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self._finish(seq)
        if request.state is not None:
            for sample in request.state.samples:
                if sample.finish_reason is None:
                    sample.finish_reason = "abort"
        self._record_gauges()
        return True

    def finish_seq(self, request_id: str, index: int, reason: str) -> None:
        """A sample ended outside the step loop (a stop string): stop its sequence."""
        request = self.requests.get(request_id)
        if request is None or index >= len(request.seqs):
            return
        seq = request.seqs[index]
        if not seq.is_finished:
            seq.finish_reason = reason
            self._finish(seq)
        if request.is_finished:
            self.requests.pop(request_id, None)

    def _finish(self, seq: Sequence) -> None:
        self.scheduler.finish(seq)
        if seq.params.seed is not None:
            self._released_seq_ids.append(seq.seq_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or self._in_flight is not None

    @property
    def healthy(self) -> bool:
        """False once a tensor-parallel rank has died; always True in process."""
        return self.runner.healthy

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers (nothing to do in process). Idempotent."""
        self.runner.shutdown()

    # --- one step ----------------------------------------------------------------------

    def step(self) -> list[RequestDelta]:
        """One step, its outputs turned into deltas here (the synchronous API)."""
        out = self.step_core()
        if out is None or not out.seqs:
            return []
        results, stops = process_step(out, self._states, self.stats)
        for request_id, index in stops:
            self.finish_seq(request_id, index, "stop")
        deltas = []
        for state, outputs in results:
            if state.finished:
                self._states.pop(state.request_id, None)
            deltas.append(
                RequestDelta(state.request_id, state.num_prompt_tokens, outputs, state.finished)
            )
        return deltas

    def step_core(self, before_wait: Callable[[], None] | None = None) -> StepOutput | None:
        """Schedule, launch and commit a step; return the tokens of the step that completed
        (with asynchronous scheduling, the one launched before), or None. `before_wait` is
        called when the step thread is about to wait for the device."""
        step = self.scheduler.schedule()
        if step.is_empty:
            out = self._drain(before_wait)
            self._record_gauges()
            return out
        inputs = self.input_batch.build(step, self._released_seq_ids)
        self._released_seq_ids.clear()
        if not self.async_scheduling:
            result = self.runner.execute(inputs)
            return self._complete(self._commit(step), result)
        assert isinstance(self.runner, ModelRunner)
        handle = self.runner.launch(inputs)
        launched = _InFlight(self._commit(step), handle)
        previous, self._in_flight = self._in_flight, launched
        if previous is None:
            return None
        return self._complete(previous.sampled, previous.handle.result(before_wait))

    def _drain(self, before_wait: Callable[[], None] | None) -> StepOutput | None:
        """Nothing to schedule: read back the step in flight, if any."""
        previous, self._in_flight = self._in_flight, None
        if previous is None:
            return None
        return self._complete(previous.sampled, previous.handle.result(before_wait))

    def _commit(self, step: SchedulerOutput) -> list[Sequence]:
        self.scheduler.commit(step)
        for request in step.ready_to_fork:
            self._fork(request)
        num_seqs = len(step.scheduled)
        self.stats.record_step(
            StepRecord(
                step=self.stats.num_steps,
                num_prefill_seqs=step.num_prefill_seqs,
                num_decode_seqs=num_seqs - step.num_prefill_seqs,
                num_prefill_tokens=step.num_prefill_tokens,
                num_decode_tokens=num_seqs - step.num_prefill_seqs,
                request_ids=tuple(step.request_ids),
            )
        )
        return step.sampled

    def _complete(self, sampled: list[Sequence], result: StepResult) -> StepOutput:
        """The step's tokens reached the host: append them, finish what must stop."""
        now = time.monotonic()
        tokens = result.token_ids
        max_len = self.max_model_len
        finished: dict[int, str] = {}
        dropped: list[int] = []
        for position, (seq, token) in enumerate(zip(sampled, tokens, strict=True)):
            if seq.status is SequenceStatus.FINISHED:
                dropped.append(position)  # aborted or stopped while the step ran
                continue
            token_ids = seq.token_ids
            token_ids.append(token)
            seq.num_pending -= 1
            num_tokens = len(token_ids)
            grammar = seq.grammar
            if grammar is not None and (not grammar.accept(token) or grammar.is_terminated):
                finished[position] = "stop"  # the grammar ended (it allowed only EOS)
            elif (
                token in seq.stop_ids
                and num_tokens - seq.num_prompt_tokens >= seq.params.min_tokens
            ):
                finished[position] = "stop"
            elif num_tokens >= seq.token_limit or num_tokens >= max_len:
                finished[position] = "length"
        for position, reason in finished.items():
            seq = sampled[position]
            seq.finish_reason = reason
            self._finish(seq)
            request = seq.request
            if request.is_finished:
                self.requests.pop(request.request_id, None)
        logprobs = result.logprobs
        if dropped:
            gone = set(dropped)
            keep = [i for i in range(len(sampled)) if i not in gone]
            renumber = {old: new for new, old in enumerate(keep)}
            finished = {renumber[i]: reason for i, reason in finished.items()}
            sampled = [sampled[i] for i in keep]
            tokens = [tokens[i] for i in keep]
            logprobs = None if logprobs is None else [logprobs[i] for i in keep]
        self.stats.record_tokens(prompt=0, generated=len(sampled))
        self._record_gauges()
        return StepOutput(now, sampled, tokens, logprobs, finished)

    def _record_gauges(self) -> None:
        bm = self.block_manager
        scheduler = self.scheduler
        running, waiting = scheduler.request_counts()
        self.stats.record_gauges(
            running=running,
            waiting=waiting,
            kv_usage=bm.num_used_blocks / bm.num_blocks,
            allocated_slots=scheduler.num_running_blocks * bm.block_size,
            used_tokens=scheduler.num_running_tokens,
            prefix_hits=bm.prefix_cache_hits,
            prefix_queries=bm.prefix_cache_queries,
        )

    # --- results -----------------------------------------------------------------------

    @staticmethod
    def request_output(request: Request) -> RequestOutput:
        """What the client of a request added with `track_output` has seen so far."""
        state = request.state
        if state is None:
            raise ValueError(f"request {request.request_id!r} was added without track_output")
        outputs = [
            CompletionOutput(
                index=index,
                text=sample.text,
                token_ids=list(sample.token_ids),
                finish_reason=sample.finish_reason,
                logprobs=list(sample.logprobs) if request.params.logprobs is not None else None,
            )
            for index, sample in enumerate(state.samples)
        ]
        return RequestOutput(
            request.request_id,
            request.prompt,
            list(request.prompt_token_ids),
            outputs,
            state.finished,
        )


class LLM:
    """Offline batch generation: `LLM(path).generate(prompts, params)`."""

    def __init__(
        self, model: str | Path | EngineConfig, progress: bool = True, **settings: object
    ) -> None:
        config = (
            model if isinstance(model, EngineConfig) else EngineConfig(model=str(model), **settings)
        )  # type: ignore[arg-type]
        self.engine = LLMEngine(config, progress=progress)
        self._batch_ids = itertools.count()

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    def default_sampling_params(self) -> SamplingParams:
        """What ``generate`` uses without params: the checkpoint's recommended sampling."""
        return SamplingParams(**self.engine.sampling_defaults)

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers, if any (they also end with this process)."""
        self.engine.shutdown()

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str):
            prompts = [prompts]
        if params is None or isinstance(params, SamplingParams):
            params = [params or self.default_sampling_params()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        for prompt, p in zip(prompts, params, strict=True):
            self.engine.check_request(prompt, p)  # all or nothing: fail before adding any
        base = next(self._batch_ids)
        requests = [
            self.engine.add_request(f"offline-{base}-{i}", prompt, p)
            for i, (prompt, p) in enumerate(zip(prompts, params, strict=True))
        ]
        try:
            while any(not r.is_finished for r in requests):
                self.engine.step()
        finally:
            for request in requests:
                if not request.is_finished:
                    self.engine.abort_request(request.request_id)
        return [self.engine.request_output(r) for r in requests]
