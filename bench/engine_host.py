"""Host work per engine step (``python -m bench.engine --workload host``): the model call is
replaced by random tokens, everything else runs as on the GPU path.

The stub runner keeps the runner's host side (the step's tensors, the sampling batch, the
one device-to-host read of the tokens) and skips only the forward pass and the sampler's
math. Requests stream through `AsyncEngine` to asyncio consumers, as in the gateway, so
scheduling, input building, commit, detokenization, stop checks and delta delivery all run.

Load W1: 256 requests, prompts U[100, 1024] tokens (seed 0), 256 output tokens, EOS
ignored. Reported: the step loop's wall time per decode step (median over decode-only
steps with at least ``min_running`` sequences), the step thread's CPU time per such step,
and the process CPU time (every thread, plus reaped children) per step over the span of
those steps, and where the step thread ran beside the event loop (`host_threads`: the
choice, and with `auto` the per-token timings it was made on). Prints one JSON line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import gc
import json
import random
import resource
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import uvloop

from engine.config import EngineConfig
from engine.core.async_engine import AsyncEngine
from engine.core.input_batch import StepInputs
from engine.core.llm_engine import LLMEngine
from engine.core.model_runner import ModelRunner, StepHandle
from engine.errors import ConfigError
from engine.kernels import resolve_backend
from engine.layers.sampler import SamplerOutput
from engine.loader import load_model_args
from engine.models.llama import ParallelSpec
from engine.sampling import SamplingParams
from engine.tokenizer import REPLACEMENT_CHAR, Tokenizer


@dataclass(frozen=True)
class HostLoad:
    num_requests: int
    prompt_len: tuple[int, int]  # inclusive, uniform
    output_len: int
    min_running: int  # a decode step counts with at least this many running sequences


W1_HOST = HostLoad(256, (100, 1024), 256, 200)
TINY_HOST = HostLoad(16, (16, 64), 24, 12)
# The model whose shape sizes the sampling tensors (vocabulary, EOS): Qwen3-0.6B.
HOST_VOCAB = 151936


class StubRunner(ModelRunner):
    """A `ModelRunner` without weights or KV pool: tokens are drawn at random from
    `token_pool`; the step's host work (input staging and tensors, the sampling batch,
    per-row sampler state, the one read-back) is the runner's own."""

    def __init__(self, config: EngineConfig, model_path: Path, token_pool: list[int]) -> None:
        self.config = config
        self.tp = ParallelSpec()
        self.device = config.resolve_device()
        self.args = load_model_args(model_path)
        self.max_model_len = config.max_model_len or self.args.max_position_embeddings
        self.dtype = config.resolve_dtype(self.args.torch_dtype, self.device)
        self.backend = resolve_backend(config.attention_backend, self.device)
        self.model = None  # type: ignore[assignment]
        self._init_step_state()
        if config.num_gpu_blocks is None:
            raise ConfigError("the stub runner needs num_gpu_blocks")
        self.num_blocks = config.num_gpu_blocks
        self._pool = torch.tensor(token_pool, dtype=torch.int64, device=self.device)
        self._draws = torch.Generator(self.device).manual_seed(config.seed)

    @property
    def weight_bytes(self) -> int:
        return 0

    @torch.inference_mode()
    def launch(self, inputs: StepInputs) -> StepHandle:
        rows = self.rows
        assert rows is not None
        rows.release(inputs.released_seq_ids)
        rows.setup(inputs.new_rows)
        batch = self._to_device(inputs)
        self._take_last_sampled(inputs, batch)
        if not inputs.num_sampled:
            return StepHandle.empty()
        rows.batch(inputs.sample_rows, batch.sample_rows, self.default_generator)
        picks = torch.randint(
            len(self._pool), (inputs.num_sampled,), generator=self._draws, device=self.device
        )
        tokens = self._pool[picks]  # in place of the forward pass and the sampler's math
        rows.record(inputs.sample_rows, batch.sample_rows, tokens)
        self._last_sampled = tokens
        output = SamplerOutput(tokens, None, None, None)
        return StepHandle.start(output, None, self.device)


def clean_tokens(tokenizer: Tokenizer) -> list[int]:
    """Ids that decode on their own to printable text (no special or partial-byte tokens)."""
    pool = []
    for token_id in range(tokenizer.vocab_size):
        if tokenizer.is_special(token_id):
            continue
        text = tokenizer.decode([token_id])
        if text and REPLACEMENT_CHAR not in text and text.isprintable():
            pool.append(token_id)
    return pool


def write_host_model(directory: Path) -> Path:
    """The tiny checkpoint's tokenizer with Qwen3-0.6B's vocabulary size in config.json."""
    from tiny_checkpoint import write_tiny_checkpoint

    write_tiny_checkpoint(directory, "qwen3", vocab_size=512)
    config_file = directory / "config.json"
    config = json.loads(config_file.read_text())
    config["vocab_size"] = HOST_VOCAB
    config["max_position_embeddings"] = 40960
    config_file.write_text(json.dumps(config))
    return directory


def host_params(load: HostLoad, penalties: bool) -> SamplingParams:
    if penalties:  # the sampling batch the issue measured at 8.8 ms a step, + repetition
        return SamplingParams(
            temperature=1.0,
            top_p=0.9,
            presence_penalty=0.5,
            repetition_penalty=1.1,
            max_tokens=load.output_len,
            ignore_eos=True,
        )
    return SamplingParams(temperature=0.0, max_tokens=load.output_len, ignore_eos=True)


async def _stream_all(
    engine: AsyncEngine, prompts: list[list[int]], params: SamplingParams
) -> tuple[int, int]:
    """Every request streams to its own consumer task; returns (tokens, characters) seen."""
    seen = [0, 0]

    async def consume(request_id: str, prompt: list[int]) -> None:
        async for output in engine.generate(request_id, prompt, params):
            seen[0] += len(output.token_ids)
            seen[1] += len(output.text)

    await asyncio.gather(*(consume(f"host-{i}", p) for i, p in enumerate(prompts)))
    return seen[0], seen[1]


def run_host(
    load: HostLoad,
    seed: int = 0,
    max_num_batched_tokens: int = 8192,
    penalties: bool = False,
    async_scheduling: bool = True,
    host_threads: str = "auto",
) -> dict[str, Any]:
    """One run; `async_scheduling` as on a single GPU (the default there), `host_threads` as
    `EngineConfig.host_threads`."""
    with tempfile.TemporaryDirectory(prefix="switchyard-host-") as scratch:
        model_dir = write_host_model(Path(scratch))
        tokenizer = Tokenizer(model_dir)
        pool = clean_tokens(tokenizer)
        rng = random.Random(seed)
        prompts = [
            [rng.choice(pool) for _ in range(rng.randint(*load.prompt_len))]
            for _ in range(load.num_requests)
        ]
        longest = load.prompt_len[1] + load.output_len
        blocks_per_seq = -(-longest // 16) + 1
        config = EngineConfig(
            model=str(model_dir),
            device="cpu",
            max_num_seqs=max(load.num_requests, 1),
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max(longest, max_num_batched_tokens),
            num_gpu_blocks=blocks_per_seq * load.num_requests + 16,
            seed=seed,
            async_scheduling=async_scheduling,
            # as on a GPU: no torch attention plan per step (the stub runs no attention)
            attention_backend="triton",
            host_threads=host_threads,
        )
        runner = StubRunner(config, model_dir, pool)
        engine = AsyncEngine(
            config, engine=LLMEngine(config, progress=False, runner=runner), trace_steps=True
        )
        params = host_params(load, penalties)
        # as `switchyard serve` runs: on uvloop (gateway/cli/serve.py), with what start-up
        # built frozen out of the cyclic collector (gateway/app.py)
        gc.collect()
        gc.freeze()
        children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        engine.start()
        try:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as loop:
                tokens, chars = loop.run(_stream_all(engine, prompts, params))
        finally:
            engine.shutdown()
            gc.unfreeze()
        wall = time.perf_counter() - wall_before
        cpu = time.process_time() - cpu_before
        children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        children = (children_after.ru_utime + children_after.ru_stime) - (
            children_before.ru_utime + children_before.ru_stime
        )
        history = {record.step: record for record in engine.engine.stats.step_history()}
        trace = engine.loop_trace or []
        placement = engine.host_placement
    result = summarize(load, trace, history, tokens, chars, wall, cpu + children, penalties)
    result["async_scheduling"] = async_scheduling
    if placement is not None:
        result["host_threads"] = dataclasses.asdict(placement)
    return result


def summarize(
    load: HostLoad,
    trace: list,
    history: dict,
    tokens: int,
    chars: int,
    wall: float,
    cpu: float,
    penalties: bool,
) -> dict[str, Any]:
    def is_decode(entry: Any) -> bool:
        record = history.get(entry.step)
        return (
            record is not None
            and record.num_prefill_seqs == 0
            and record.num_decode_seqs >= load.min_running
        )

    decode = [i for i, entry in enumerate(trace) if is_decode(entry)]
    result: dict[str, Any] = {
        "workload": "host",
        "requests": load.num_requests,
        "prompt_len": list(load.prompt_len),
        "output_len": load.output_len,
        "sampling": "presence+repetition_penalty+top_p" if penalties else "greedy",
        "min_running": load.min_running,
        "steps": len(trace),
        "decode_steps": len(decode),
        "output_tokens": tokens,
        "output_chars": chars,
        "step_wall_ms_p50": None,
        "step_wall_ms_p90": None,
        "step_thread_cpu_ms_p50": None,
        "cpu_ms_per_decode_step": None,
        "cpu_ms_per_step_overall": round(1000 * cpu / max(len(trace), 1), 4),
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
    }
    if decode:
        walls = [trace[i].wall_s for i in decode]
        thread_cpu = [trace[i].thread_cpu_s for i in decode]
        result["step_wall_ms_p50"] = round(1000 * statistics.median(walls), 4)
        result["step_wall_ms_p90"] = round(1000 * sorted(walls)[int(0.9 * (len(walls) - 1))], 4)
        result["step_thread_cpu_ms_p50"] = round(1000 * statistics.median(thread_cpu), 4)
        first, last = decode[0], decode[-1]
        if first > 0 and last > first:
            # every thread's CPU from the end of the step before the first to the last one
            span = trace[last].process_cpu_s - trace[first - 1].process_cpu_s
            result["cpu_ms_per_decode_step"] = round(1000 * span / (last - first + 1), 4)
    result["date"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    result["torch"] = torch.__version__
    return result
