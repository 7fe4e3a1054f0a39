"""The host bench's load through nano-vllm's scheduler and input preparation, beside ours.

``python -m bench.engine --workload host --nano-vllm PATH [--repeats N]``: PATH is a checkout
of nano-vllm (github.com/GeeeekExplorer/nano-vllm; it needs ``xxhash``). Nothing of it is
copied here: its own modules are imported from PATH and driven as its `LLMEngine.step` drives
them, with the model call replaced by random tokens, as our stub runner does. A decode step
is `Scheduler.schedule`, `ModelRunner.prepare_decode` and `prepare_sample` (its input tensors
and temperatures) and `Scheduler.postprocess` (append, stop checks, block hashing). Without
a GPU its tensors stay on the host: `pin_memory` and `.cuda()` are dropped (the lists and
`torch.tensor` calls, which are the host work, run as written), and ``flash_attn``, which
only its attention layer uses, is stood in for by a module that refuses to be called.

The runs alternate, ours then nano-vllm's, ``repeats`` times in one process, and one JSON
line reports the medians of each, their ratios, every run, the CPU model and the load
average at the start and the end.
"""

from __future__ import annotations

import datetime as dt
import importlib
import os
import random
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import torch

from bench.engine_host import HostLoad, clean_tokens, run_host, write_host_model
from bench.machine import cpu_model
from engine.tokenizer import Tokenizer

NANO_BLOCK_SIZE = 256  # nano-vllm's smallest KV block


class _OnHost(torch.Tensor):
    """A host tensor whose `.cuda()` is itself: nano-vllm's inputs on a machine without CUDA."""

    def cuda(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self


def _host_tensor(data: Any, dtype: torch.dtype | None = None, pin_memory: bool = False) -> Any:
    del pin_memory  # no pinned memory without CUDA
    return torch.tensor(data, dtype=dtype).as_subclass(_OnHost)


def _import_nano(path: Path) -> dict[str, Any]:
    """nano-vllm's modules from the checkout at `path`."""
    if not (path / "nanovllm" / "engine" / "scheduler.py").is_file():
        raise SystemExit(f"error: {path} is not a nano-vllm checkout (no nanovllm/engine)")
    try:
        importlib.import_module("xxhash")
    except ImportError:
        raise SystemExit("error: nano-vllm needs xxhash: pip install xxhash") from None
    if importlib.util.find_spec("flash_attn") is None:
        stand_in = types.ModuleType("flash_attn")

        def refuse(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("flash_attn is not installed: the host bench runs no attention")

        stand_in.flash_attn_varlen_func = refuse  # type: ignore[attr-defined]
        stand_in.flash_attn_with_kvcache = refuse  # type: ignore[attr-defined]
        sys.modules["flash_attn"] = stand_in
    sys.path.insert(0, str(path))
    try:
        modules = {
            name: importlib.import_module(f"nanovllm.{name}")
            for name in ("config", "sampling_params", "engine.sequence", "engine.scheduler")
        }
        runner = importlib.import_module("nanovllm.engine.model_runner")
    finally:
        sys.path.remove(str(path))
    prepare = {}
    for name in ("prepare_block_tables", "prepare_prefill", "prepare_decode", "prepare_sample"):
        function = getattr(runner.ModelRunner, name)
        if not torch.cuda.is_available():  # the same code, its torch calls kept on the host
            scope = dict(function.__globals__)
            scope["torch"] = types.SimpleNamespace(
                tensor=_host_tensor, int64=torch.int64, int32=torch.int32, float32=torch.float32
            )
            function = types.FunctionType(function.__code__, scope, function.__name__)
        prepare[name] = function
    return {**modules, "prepare": prepare}


def run_nano(
    nano: dict[str, Any], load: HostLoad, model_dir: Path, pool: list[int], seed: int
) -> dict[str, Any]:
    """One run of `load` through nano-vllm's scheduler and input preparation."""
    rng = random.Random(seed)  # the same prompts as `run_host`
    prompts = [
        [rng.choice(pool) for _ in range(rng.randint(*load.prompt_len))]
        for _ in range(load.num_requests)
    ]
    longest = load.prompt_len[1] + load.output_len
    blocks_per_seq = -(-longest // NANO_BLOCK_SIZE) + 1
    config = nano["config"].Config(
        str(model_dir),
        max_num_batched_tokens=8192,
        max_num_seqs=load.num_requests,
        max_model_len=max(longest, 8192),
        kvcache_block_size=NANO_BLOCK_SIZE,
        num_kvcache_blocks=blocks_per_seq * load.num_requests + 16,
    )
    sequence = nano["engine.sequence"]
    sequence.Sequence.block_size = NANO_BLOCK_SIZE  # as its LLMEngine sets it
    scheduler = nano["engine.scheduler"].Scheduler(config)
    params = nano["sampling_params"].SamplingParams(
        temperature=1.0, max_tokens=load.output_len, ignore_eos=True
    )
    for prompt in prompts:
        scheduler.add(sequence.Sequence(prompt, params))
    # its ModelRunner's host half: the block size and its prepare_* methods, nothing on a GPU
    runner = types.SimpleNamespace(block_size=NANO_BLOCK_SIZE)
    for name, function in nano["prepare"].items():
        setattr(runner, name, types.MethodType(function, runner))
    draws = random.Random(seed)
    walls: list[float] = []
    cpus: list[float] = []
    steps = tokens = 0
    began = time.perf_counter()
    while not scheduler.is_finished():
        wall, cpu = time.perf_counter(), time.thread_time()
        seqs, is_prefill = scheduler.schedule()
        if is_prefill:
            runner.prepare_prefill(seqs)
        else:
            runner.prepare_decode(seqs)
        runner.prepare_sample(seqs)
        sampled = [draws.choice(pool) for _ in seqs]  # in place of the model and its sampler
        scheduler.postprocess(seqs, sampled, is_prefill)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        steps += 1
        if not is_prefill:
            tokens += len(seqs)
            if len(seqs) >= load.min_running:
                walls.append(wall)
                cpus.append(cpu)
    return {
        "steps": steps,
        "decode_steps": len(walls),
        "decode_tokens": tokens,
        "step_wall_ms_p50": round(1000 * statistics.median(walls), 4) if walls else None,
        "step_cpu_ms_p50": round(1000 * statistics.median(cpus), 4) if cpus else None,
        "wall_s": round(time.perf_counter() - began, 3),
    }


def run_side_by_side(
    load: HostLoad, nano_path: Path, repeats: int, seed: int, host_threads: str = "auto"
) -> dict[str, Any]:
    """Ours (`run_host`, streaming through `AsyncEngine`) and nano-vllm's, taking turns."""
    nano = _import_nano(nano_path.resolve())
    load_before = os.getloadavg()[0]
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="switchyard-nano-") as scratch:
        model_dir = write_host_model(Path(scratch))
        pool = clean_tokens(Tokenizer(model_dir))
        for _ in range(repeats):
            ours.append(run_host(load, seed=seed, host_threads=host_threads))
            theirs.append(run_nano(nano, load, model_dir, pool, seed))

    def median(runs: list[dict[str, Any]], key: str) -> float | None:
        values = [run[key] for run in runs if run[key] is not None]
        return round(statistics.median(values), 4) if values else None

    summary = {
        "ours_step_wall_ms": median(ours, "step_wall_ms_p50"),
        "ours_step_thread_cpu_ms": median(ours, "step_thread_cpu_ms_p50"),
        "ours_cpu_all_threads_ms": median(ours, "cpu_ms_per_decode_step"),
        "nano_vllm_step_wall_ms": median(theirs, "step_wall_ms_p50"),
        "nano_vllm_step_cpu_ms": median(theirs, "step_cpu_ms_p50"),
    }
    if summary["nano_vllm_step_wall_ms"] and summary["ours_step_wall_ms"]:
        summary["ratio_wall"] = round(
            summary["ours_step_wall_ms"] / summary["nano_vllm_step_wall_ms"], 3
        )
    if summary["nano_vllm_step_cpu_ms"] and summary["ours_step_thread_cpu_ms"]:
        nano_cpu = summary["nano_vllm_step_cpu_ms"]
        summary["ratio_step_thread_cpu"] = round(summary["ours_step_thread_cpu_ms"] / nano_cpu, 3)
        if summary["ours_cpu_all_threads_ms"]:
            summary["ratio_all_threads_cpu"] = round(
                summary["ours_cpu_all_threads_ms"] / nano_cpu, 3
            )
    return {
        "workload": "host",
        "against": "nano-vllm",
        "requests": load.num_requests,
        "prompt_len": list(load.prompt_len),
        "output_len": load.output_len,
        "repeats": repeats,
        **summary,
        "ours": ours,
        "nano_vllm": theirs,
        "cpu": cpu_model(),
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # start, end
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
    }
