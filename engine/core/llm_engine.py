"""The synchronous engine (`LLMEngine`: add requests, step) and the offline `LLM` API."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path

from engine.config import EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.distributed import TensorParallelExecutor
from engine.core.model_runner import ModelRunner, SampledToken, build_step_inputs
from engine.core.scheduler import Scheduler
from engine.core.sequence import Request, Sequence, TokenLogprobs
from engine.core.stats import EngineStats, StepRecord
from engine.errors import InvalidPromptError
from engine.loader import resolve_model_path
from engine.sampling import SamplingParams
from engine.tokenizer import IncrementalDetokenizer, Tokenizer


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
class CompletionDelta:
    """What one sample produced since the last delta (text never splits a character)."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None
    finish_reason: str | None
    num_output_tokens: int  # cumulative


@dataclass
class RequestDelta:
    request_id: str
    num_prompt_tokens: int
    deltas: list[CompletionDelta]
    finished: bool


def _held_back(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that could still grow into a stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


class LLMEngine:
    def __init__(self, config: EngineConfig, progress: bool = True) -> None:
        self.config = config
        path = resolve_model_path(config.model, config.download_dir)
        self.tokenizer = Tokenizer(config.tokenizer or path)
        self.runner: ModelRunner | TensorParallelExecutor
        if config.tensor_parallel_size > 1:
            self.runner = TensorParallelExecutor(config, path, progress=progress)
        else:
            self.runner = ModelRunner(config, path, progress=progress)
        args = self.runner.args
        self.eos_token_ids = self.tokenizer.eos_token_ids | frozenset(args.eos_token_id)
        self._released_seq_ids: list[int] = []  # seeded sequences done since the last step
        self.max_model_len = self.runner.max_model_len
        self.block_manager = BlockManager(
            self.runner.num_blocks, config.block_size, config.enable_prefix_caching
        )
        self.stats = EngineStats()
        self.scheduler = Scheduler(config, self.max_model_len, self.block_manager, self.stats)
        self.requests: dict[str, Request] = {}
        self._seq_ids = itertools.count()

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
        return token_ids

    def add_request(
        self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None
    ) -> Request:
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        text, token_ids = self.encode_prompt(prompt)
        self.scheduler.check_fits(len(token_ids), params)
        request = Request(request_id, text, token_ids, params)
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
        detokenizer = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids)
        seq = Sequence(next(self._seq_ids), request, index, detokenizer, None)
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
        if request is None:
            return False
        request.pending_forks = 0
        for seq in request.seqs:
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self._finish(seq)
        self._record_gauges()
        return True

    def _finish(self, seq: Sequence) -> None:
        self.scheduler.finish(seq)
        if seq.params.seed is not None:
            self._released_seq_ids.append(seq.seq_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def healthy(self) -> bool:
        """False once a tensor-parallel rank has died; always True in process."""
        return self.runner.healthy

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers (nothing to do in process). Idempotent."""
        self.runner.shutdown()

    # --- one step ----------------------------------------------------------------------

    def step(self) -> list[RequestDelta]:
        plan = self.scheduler.schedule()
        if plan.is_empty:
            self._record_gauges()
            return []
        inputs = build_step_inputs(
            plan,
            self.config.block_size,
            self.eos_token_ids,
            self.runner.args.vocab_size,
            self._released_seq_ids,
        )
        self._released_seq_ids.clear()
        sampled = self.runner.execute(inputs)
        self.scheduler.commit(plan.scheduled)
        now = time.monotonic()
        for item in plan.scheduled:
            request = item.seq.request
            if request.pending_forks and item.seq.num_computed_tokens == item.seq.compute_target():
                self._fork(request)
        touched: dict[str, Request] = {}
        sampled_items = [item for item in plan.scheduled if item.sample]
        for item, token in zip(sampled_items, sampled, strict=True):
            self._append_token(item.seq, token, now)
            touched[item.seq.request.request_id] = item.seq.request
        prefills = [item for item in plan.scheduled if item.is_prefill]
        decodes = [item for item in plan.scheduled if not item.is_prefill]
        self.stats.record_step(
            StepRecord(
                step=self.stats.num_steps,
                num_prefill_seqs=len(prefills),
                num_decode_seqs=len(decodes),
                num_prefill_tokens=sum(i.num_tokens for i in prefills),
                num_decode_tokens=sum(i.num_tokens for i in decodes),
                request_ids=tuple(i.seq.request.request_id for i in plan.scheduled),
            )
        )
        deltas = [self._delta(request) for request in touched.values()]
        for request in touched.values():
            if request.is_finished:
                self.requests.pop(request.request_id, None)
                self.stats.record_finished(now - request.arrival_time)
        self._record_gauges()
        return deltas

    def _append_token(self, seq: Sequence, token: SampledToken, now: float) -> None:
        params = seq.params
        seq.token_ids.append(token.token_id)
        seq.output_counts[token.token_id] += 1
        if token.logprobs is not None:
            seq.logprobs.append(token.logprobs)
        if seq.first_token_time is None:
            seq.first_token_time = now
            self.stats.record_first_token(now - seq.request.arrival_time)
        elif seq.last_token_time is not None:
            self.stats.record_inter_token(now - seq.last_token_time)
        seq.last_token_time = now
        self.stats.record_tokens(prompt=0, generated=1)
        previous_len = len(seq.output_text)
        if seq.detokenizer is not None:
            seq.output_text += seq.detokenizer.push(token.token_id)
        reason = None
        stop_token = token.token_id in params.stop_token_ids or (
            not params.ignore_eos and token.token_id in self.eos_token_ids
        )
        if seq.num_output_tokens >= params.min_tokens and (
            stop_token or (params.stop and self._cut_at_stop(seq, previous_len))
        ):
            reason = "stop"
        if reason is None and (
            seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len
        ):
            reason = "length"
        if reason is not None:
            seq.finish_reason = reason
            self._finish(seq)

    @staticmethod
    def _cut_at_stop(seq: Sequence, previous_len: int) -> bool:
        """End the text at the earliest stop string (after it with include_stop_str_in_output)."""
        text = seq.output_text
        longest = max(len(s) for s in seq.params.stop)
        start = max(0, previous_len - longest + 1)
        hits = [(i, s) for s in seq.params.stop if (i := text.find(s, start)) >= 0]
        if not hits:
            return False
        index, stop = min(hits, key=lambda hit: hit[0])
        keep = len(stop) if seq.params.include_stop_str_in_output else 0
        seq.output_text = text[: index + keep]
        return True

    def _delta(self, request: Request) -> RequestDelta:
        deltas = []
        for seq in request.seqs:
            if seq.is_finished:
                safe_end = len(seq.output_text)
            else:
                safe_end = len(seq.output_text) - _held_back(seq.output_text, seq.params.stop)
            safe_end = max(safe_end, seq.emitted_text_len)
            text = seq.output_text[seq.emitted_text_len : safe_end]
            new_ids = seq.output_token_ids[seq.emitted_token_count :]
            new_logprobs = seq.logprobs[seq.emitted_logprob_count :]
            finish_news = seq.is_finished and not seq.finish_emitted
            if not text and not new_ids and not finish_news:
                continue
            seq.finish_emitted = seq.is_finished
            seq.emitted_text_len = safe_end
            seq.emitted_token_count = seq.num_output_tokens
            seq.emitted_logprob_count = len(seq.logprobs)
            deltas.append(
                CompletionDelta(
                    index=seq.index,
                    text=text,
                    token_ids=new_ids,
                    logprobs=new_logprobs if seq.params.logprobs is not None else None,
                    finish_reason=seq.finish_reason,
                    num_output_tokens=seq.num_output_tokens,
                )
            )
        return RequestDelta(
            request.request_id, len(request.prompt_token_ids), deltas, request.is_finished
        )

    def _record_gauges(self) -> None:
        bm = self.block_manager
        running = self.scheduler.running
        self.stats.record_gauges(
            running=len({s.request.request_id for s in running}),
            waiting=len({s.request.request_id for s in self.scheduler.waiting}),
            kv_usage=bm.num_used_blocks / bm.num_blocks,
            allocated_slots=sum(len(s.block_table) for s in running) * bm.block_size,
            used_tokens=sum(s.num_computed_tokens for s in running),
            prefix_hits=bm.prefix_cache_hits,
            prefix_queries=bm.prefix_cache_queries,
        )

    # --- results -----------------------------------------------------------------------

    @staticmethod
    def request_output(request: Request) -> RequestOutput:
        outputs = [
            CompletionOutput(
                index=seq.index,
                text=seq.output_text,
                token_ids=seq.output_token_ids,
                finish_reason=seq.finish_reason,
                logprobs=list(seq.logprobs) if seq.params.logprobs is not None else None,
            )
            for seq in sorted(request.seqs, key=lambda s: s.index)
        ]
        return RequestOutput(
            request.request_id,
            request.prompt,
            list(request.prompt_token_ids),
            outputs,
            request.is_finished,
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
            params = [params or SamplingParams()] * len(prompts)
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
