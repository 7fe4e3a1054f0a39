"""Engine throughput and latency workloads: ``python -m bench.engine --workload W1 [--tiny]``.

W1  Qwen3-0.6B shape, 256 requests, prompts U[100, 1024] tokens, 256 output tokens.
W2  Llama-3.1-8B shape, 128 requests, same lengths.
W3  256 requests sharing a 1,024-token prefix (64-token unique suffixes): prefix caching
    on vs off, with the ratio.
W4  batch-1 decode: time per token against weight bytes / measured copy bandwidth.
W5  online: Poisson arrivals through ``AsyncEngine``; TTFT and ITL percentiles.
host  the engine's host work per step, model call stubbed (``bench.engine_host``).
smollm2  the bundled real model on the CPU, batch 1 and 16, against HF ``generate``
    (``bench.engine_smollm2``; not part of ``all``). Against llama.cpp on the same file:
    ``python -m bench.engine_quant --llama-python PATH``.

Weights are random (bf16 on CUDA, fp32 on the CPU) in the real shapes, written once to a
temporary HF-format directory; EOS is ignored so every request makes its full output. Each
workload prints ONE JSON line on stdout (progress goes to stderr). ``--tiny`` shrinks the
model and the workload so a CPU finishes W1 in seconds: it proves the harness, not a speed.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import json
import math
import os
import platform
import random
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

WORKLOADS = ("W1", "W2", "W3", "W4", "W5")


# --- model shapes ------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    name: str
    family: str  # a `tests/support/tiny_checkpoint.py` family: qwen3 | llama
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int

    def hf_config(self, dtype: torch.dtype) -> dict[str, Any]:
        return {
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "torch_dtype": str(dtype).removeprefix("torch."),
        }

    def summary(self) -> dict[str, Any]:
        keys = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim")
        extra = ("intermediate_size", "vocab_size", "tie_word_embeddings")
        return {k: getattr(self, k) for k in (*keys, *extra)}


QWEN3_0_6B = ModelShape("Qwen3-0.6B", "qwen3", 1024, 28, 16, 8, 128, 3072, 151936, True, 40960)
LLAMA_3_1_8B = ModelShape(
    "Llama-3.1-8B", "llama", 4096, 32, 32, 8, 128, 14336, 128256, False, 131072
)
# The tiny stand-ins keep each family's quirks (Qwen3 q/k norm, Llama 3 RoPE scaling).
TINY_QWEN3 = ModelShape("tiny-qwen3", "qwen3", 64, 2, 4, 2, 16, 128, 512, True, 2048)
TINY_LLAMA = ModelShape("tiny-llama", "llama", 64, 2, 4, 1, 16, 128, 512, False, 2048)


# --- workloads ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    name: str
    shape: ModelShape
    num_requests: int
    prompt_len: tuple[int, int]  # inclusive range, uniform
    output_len: int
    shared_prefix_len: int = 0
    arrival_rate: float | None = None  # requests/s (W5)


def make_workload(name: str, tiny: bool, arrival_rate: float | None = None) -> Workload:
    """The workload as specified, or its ``--tiny`` scale model."""
    qwen, llama = (TINY_QWEN3, TINY_LLAMA) if tiny else (QWEN3_0_6B, LLAMA_3_1_8B)
    # name: model, then (requests, prompt length range, output length, shared prefix length,
    # arrival rate) as specified and at the --tiny scale
    scales = {
        "W1": (qwen, (256, (100, 1024), 256, 0, None), (8, (16, 64), 16, 0, None)),
        "W2": (llama, (128, (100, 1024), 256, 0, None), (4, (16, 64), 16, 0, None)),
        "W3": (qwen, (256, (64, 64), 64, 1024, None), (8, (8, 8), 4, 64, None)),
        "W4": (qwen, (1, (128, 128), 256, 0, None), (1, (16, 16), 16, 0, None)),
        "W5": (qwen, (128, (100, 1024), 128, 0, 4.0), (8, (16, 64), 8, 0, 50.0)),
    }
    if name not in scales:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    shape, full, small = scales[name]
    workload = Workload(name, shape, *(small if tiny else full))
    if arrival_rate is not None and workload.arrival_rate is not None:
        workload = replace(workload, arrival_rate=arrival_rate)
    return workload


def make_prompts(workload: Workload, seed: int) -> list[list[int]]:
    """Seeded random token ids; W3 prompts share one prefix and differ in their suffix."""
    rng = random.Random(seed)
    vocab = workload.shape.vocab_size
    prefix = [rng.randrange(vocab) for _ in range(workload.shared_prefix_len)]
    prompts = []
    for _ in range(workload.num_requests):
        length = rng.randint(*workload.prompt_len)
        prompts.append(prefix + [rng.randrange(vocab) for _ in range(length)])
    return prompts


# --- random checkpoints ------------------------------------------------------------------


def _random_tensors(
    shape: ModelShape, dtype: torch.dtype, device: torch.device, seed: int
) -> dict[str, torch.Tensor]:
    """HF-named random weights, drawn on ``device`` (fast on a GPU) and kept on the host."""
    generator = torch.Generator(device).manual_seed(seed)
    std = 0.02  # the families' initializer_range: keeps activations finite over many layers

    def normal(*dims: int) -> torch.Tensor:
        values = torch.randn(dims, generator=generator, device=device) * std
        return values.to(dtype).cpu()

    def norm_weight(size: int) -> torch.Tensor:
        return torch.ones(size, dtype=dtype)

    hidden, heads, kv_heads, head_dim = (
        shape.hidden_size,
        shape.num_heads,
        shape.num_kv_heads,
        shape.head_dim,
    )
    weights = {"model.embed_tokens.weight": normal(shape.vocab_size, hidden)}
    for layer in range(shape.num_layers):
        prefix = f"model.layers.{layer}."
        weights[prefix + "self_attn.q_proj.weight"] = normal(heads * head_dim, hidden)
        weights[prefix + "self_attn.k_proj.weight"] = normal(kv_heads * head_dim, hidden)
        weights[prefix + "self_attn.v_proj.weight"] = normal(kv_heads * head_dim, hidden)
        weights[prefix + "self_attn.o_proj.weight"] = normal(hidden, heads * head_dim)
        if shape.family == "qwen3":
            weights[prefix + "self_attn.q_norm.weight"] = norm_weight(head_dim)
            weights[prefix + "self_attn.k_norm.weight"] = norm_weight(head_dim)
        weights[prefix + "mlp.gate_proj.weight"] = normal(shape.intermediate_size, hidden)
        weights[prefix + "mlp.up_proj.weight"] = normal(shape.intermediate_size, hidden)
        weights[prefix + "mlp.down_proj.weight"] = normal(hidden, shape.intermediate_size)
        weights[prefix + "input_layernorm.weight"] = norm_weight(hidden)
        weights[prefix + "post_attention_layernorm.weight"] = norm_weight(hidden)
    weights["model.norm.weight"] = norm_weight(hidden)
    if not shape.tie_word_embeddings:
        weights["lm_head.weight"] = normal(shape.vocab_size, hidden)
    return weights


def write_random_checkpoint(
    path: Path, shape: ModelShape, dtype: torch.dtype, device: torch.device, seed: int = 0
) -> Path:
    """A loadable HF directory of ``shape`` with random weights.

    The tokenizer files come from ``tests/support/tiny_checkpoint.py`` (a small real BPE); config.json
    is then rewritten with the full shape, so token ids beyond the tokenizer decode to
    nothing, which is all a benchmark with random prompts needs.
    """
    from safetensors.torch import save_file
    from tiny_checkpoint import write_tiny_checkpoint

    write_tiny_checkpoint(path, shape.family, seed=seed, vocab_size=512)
    config_file = path / "config.json"
    config = json.loads(config_file.read_text())
    config.update(shape.hf_config(dtype))
    config_file.write_text(json.dumps(config, indent=2))
    for old in path.glob("*.safetensors"):
        old.unlink()
    weights = _random_tensors(shape, dtype, device, seed)
    # Shards of about 2 GiB keep host memory and save time bounded for the 8B shape.
    shard: dict[str, torch.Tensor] = {}
    shard_bytes, index = 0, 0
    for name in list(weights):
        tensor = weights.pop(name)
        shard[name] = tensor
        shard_bytes += tensor.numel() * tensor.element_size()
        if shard_bytes >= 2 << 30 or not weights:
            save_file(shard, str(path / f"model-{index:05d}.safetensors"), {"format": "pt"})
            shard, shard_bytes, index = {}, 0, index + 1
    return path


# --- measurement -------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile ``q`` in [0, 100]; None for no samples."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def measure_copy_bandwidth(device: torch.device, num_bytes: int, iterations: int = 10) -> float:
    """Bytes/s of a device-to-device copy, counting the read and the write (2 x size)."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm up (allocation, first touch)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(iterations):
        dst.copy_(src)
    synchronize(device)
    elapsed = time.perf_counter() - start
    del src, dst
    return 2 * num_bytes * iterations / elapsed


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # ru_maxrss is KiB on Linux: the process's peak resident set.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class RunRecord:
    """What one pass of a workload measured; times in seconds since its first request."""

    submitted: int = 0
    completed: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    kv_usage_peak: float = 0.0
    wall_s: float = 0.0
    truncated: bool = False

    def metrics(self) -> dict[str, Any]:
        wall = max(self.wall_s, 1e-9)

        def rounded(value: float | None, digits: int = 5) -> float | None:
            return None if value is None else round(value, digits)

        return {
            "requests": self.submitted,
            "requests_completed": self.completed,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "output_tok_s": round(self.output_tokens / wall, 2),
            "total_tok_s": round((self.prompt_tokens + self.output_tokens) / wall, 2),
            "ttft_p50_s": rounded(percentile(self.ttft, 50)),
            "ttft_p99_s": rounded(percentile(self.ttft, 99)),
            "itl_p50_s": rounded(percentile(self.itl, 50), 6),
            "itl_p99_s": rounded(percentile(self.itl, 99), 6),
            "kv_usage_peak": round(self.kv_usage_peak, 4),
            "wall_s": round(self.wall_s, 3),
            "truncated": self.truncated,
        }


class TokenClock:
    """Turns per-request token arrivals into TTFT and inter-token gaps."""

    def __init__(self, record: RunRecord, prompt_lens: dict[str, int]) -> None:
        self.record = record
        self.prompt_lens = prompt_lens
        self.sent_at: dict[str, float] = {}
        self.last_at: dict[str, float] = {}

    def sent(self, request_id: str, now: float) -> None:
        self.sent_at[request_id] = now
        self.record.submitted += 1

    def tokens(self, request_id: str, count: int, now: float, finished: bool) -> None:
        if count:
            self.record.output_tokens += count
            last = self.last_at.get(request_id)
            if last is None:
                self.record.ttft.append(now - self.sent_at[request_id])
                self.record.prompt_tokens += self.prompt_lens[request_id]
            else:
                # Several tokens in one delta share the gap (never the case with one token/step).
                self.record.itl.extend([(now - last) / count] * count)
            self.last_at[request_id] = now
        if finished:
            self.record.completed += 1


# --- runs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSettings:
    device: torch.device
    dtype: torch.dtype
    attention_backend: str
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    kv_cache_bytes: int
    seed: int


def engine_config(
    model_path: Path, workload: Workload, settings: RunSettings, prefix_caching: bool
):
    from engine import EngineConfig

    longest = workload.shared_prefix_len + workload.prompt_len[1] + workload.output_len
    return EngineConfig(
        model=str(model_path),
        dtype=str(settings.dtype).removeprefix("torch."),
        device=settings.device.type,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        kv_cache_bytes=settings.kv_cache_bytes,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_model_len=max(longest, settings.max_num_batched_tokens),
        enable_prefix_caching=prefix_caching,
        attention_backend=settings.attention_backend,
        seed=settings.seed,
    )


def build_engine(model_path: Path, workload: Workload, settings: RunSettings, prefix_caching: bool):
    """An ``LLMEngine`` for the offline workloads, an ``AsyncEngine`` for W5 (online)."""
    config = engine_config(model_path, workload, settings, prefix_caching)
    if workload.arrival_rate is not None:
        from engine import AsyncEngine

        return AsyncEngine(config, progress=False)
    from engine import LLMEngine

    return LLMEngine(config, progress=False)


def sampling_params(workload: Workload):
    from engine import SamplingParams

    # Greedy and EOS ignored: every request makes exactly `output_len` tokens.
    return SamplingParams(temperature=0.0, max_tokens=workload.output_len, ignore_eos=True)


def run_offline(engine, workload: Workload, prompts: list[list[int]], deadline: float) -> RunRecord:
    """All requests arrive at t=0; step the engine until done or past ``deadline``."""
    record = RunRecord()
    params = sampling_params(workload)
    ids = [f"bench-{i}" for i in range(len(prompts))]
    clock = TokenClock(record, {rid: len(p) for rid, p in zip(ids, prompts, strict=True)})
    start = time.perf_counter()
    for rid, prompt in zip(ids, prompts, strict=True):
        engine.add_request(rid, prompt, params)
        clock.sent(rid, 0.0)
    while engine.has_unfinished_requests():
        if time.perf_counter() > deadline:
            record.truncated = True
            for rid in ids:
                engine.abort_request(rid)
            break
        deltas = engine.step()
        now = time.perf_counter() - start
        for delta in deltas:
            count = sum(len(d.token_ids) for d in delta.deltas)
            clock.tokens(delta.request_id, count, now, delta.finished)
        record.kv_usage_peak = max(record.kv_usage_peak, engine.stats.kv_cache_usage_perc)
    synchronize(engine.runner.device)
    record.wall_s = time.perf_counter() - start
    return record


async def _run_online(
    async_engine, workload: Workload, prompts: list[list[int]], deadline: float
) -> RunRecord:
    """Requests arrive as a Poisson process and stream through the engine thread."""
    record = RunRecord()
    params = sampling_params(workload)
    rng = random.Random(workload.num_requests)
    ids = [f"online-{i}" for i in range(len(prompts))]
    clock = TokenClock(record, {rid: len(p) for rid, p in zip(ids, prompts, strict=True)})
    stats = async_engine.engine.stats
    start = time.perf_counter()

    async def one(rid: str, prompt: list[int]) -> None:
        clock.sent(rid, time.perf_counter() - start)
        async for output in async_engine.generate(rid, prompt, params):
            now = time.perf_counter() - start
            clock.tokens(rid, len(output.token_ids), now, output.finished)
            record.kv_usage_peak = max(record.kv_usage_peak, stats.kv_cache_usage_perc)

    async_engine.start()
    tasks = []
    try:
        for rid, prompt in zip(ids, prompts, strict=True):
            if time.perf_counter() > deadline:
                record.truncated = True
                break
            tasks.append(asyncio.create_task(one(rid, prompt)))
            await asyncio.sleep(rng.expovariate(workload.arrival_rate or 1.0))
        remaining = max(0.0, deadline - time.perf_counter())
        done, pending = await asyncio.wait(tasks, timeout=remaining)
        for task in pending:
            record.truncated = True
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            task.result()  # surface a failed request instead of hiding it in the figures
    finally:
        async_engine.shutdown()
    record.wall_s = time.perf_counter() - start
    return record


def run_online(async_engine, workload: Workload, prompts: list[list[int]], deadline: float):
    return asyncio.run(_run_online(async_engine, workload, prompts, deadline))


def release(engine) -> None:
    """Drop an engine and its KV pool before the next one claims the memory."""
    device = sync_engine(engine).runner.device
    del engine
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def sync_engine(engine):
    """The ``LLMEngine`` itself, or the one an ``AsyncEngine`` drives."""
    return getattr(engine, "engine", engine)


def log(message: str) -> None:
    print(f"[bench.engine] {message}", file=sys.stderr, flush=True)


# --- the workloads -----------------------------------------------------------------------


def run_workload(
    workload: Workload,
    settings: RunSettings,
    model_dir: Path,
    deadline: float,
) -> dict[str, Any]:
    """Run one workload; generation stops at ``deadline`` (perf_counter) and says so."""
    began = time.perf_counter()
    prompts = make_prompts(workload, settings.seed)
    extra: dict[str, Any] = {}
    if workload.name == "W4":
        # Measured before the engine claims its memory; 1 GiB on a GPU beats its caches.
        size = (1 << 30) if settings.device.type == "cuda" else (64 << 20)
        extra["copy_bandwidth_bytes_s"] = round(measure_copy_bandwidth(settings.device, size))

    log(f"{workload.name}: building the engine ({workload.shape.name})")
    engine = build_engine(model_dir, workload, settings, prefix_caching=True)
    model_runner = sync_engine(engine).runner
    kv_pool_blocks = model_runner.num_blocks
    kv_pool_bytes = kv_pool_blocks * model_runner.kv_bytes_per_block
    backend = model_runner.backend
    weight_bytes = model_runner.weight_bytes
    del model_runner
    runner: Callable = run_online if workload.name == "W5" else run_offline
    passes = 2 if workload.name == "W3" else 1
    # W3 leaves the second half of what is left for its prefix-caching-off pass.
    now = time.perf_counter()
    first_deadline = now + (deadline - now) / passes
    log(f"{workload.name}: {len(prompts)} requests")
    record = runner(engine, workload, prompts, first_deadline)
    peak_memory = peak_memory_bytes(settings.device)

    if workload.name == "W3":
        release(engine)
        log("W3: again with prefix caching off")
        engine = build_engine(model_dir, workload, settings, prefix_caching=False)
        off = run_offline(engine, workload, prompts, deadline)
        extra["prefix_caching_off"] = off.metrics()
        extra["prefix_caching_speedup"] = round(
            record.metrics()["total_tok_s"] / max(off.metrics()["total_tok_s"], 1e-9), 3
        )
        extra["shared_prefix_len"] = workload.shared_prefix_len
        peak_memory = max(peak_memory, peak_memory_bytes(settings.device))
    if workload.name == "W4":
        # A decode step reads every weight once, except an untied input embedding table.
        read_bytes = weight_bytes
        if not workload.shape.tie_word_embeddings:
            read_bytes -= (
                workload.shape.vocab_size * workload.shape.hidden_size * (settings.dtype.itemsize)
            )
        bound = read_bytes / extra["copy_bandwidth_bytes_s"]
        per_token = percentile(record.itl, 50)
        extra["decode_bytes_per_token"] = read_bytes
        extra["decode_bound_s_per_token"] = round(bound, 7)
        extra["decode_s_per_token"] = None if per_token is None else round(per_token, 7)
        extra["fraction_of_bound"] = None if not per_token else round(bound / per_token, 4)
    if workload.name == "W5":
        extra["arrival_rate_req_s"] = workload.arrival_rate
    release(engine)

    return {
        "workload": workload.name,
        "model": workload.shape.name,
        "shape": workload.shape.summary(),
        "device": device_name(settings.device),
        "dtype": str(settings.dtype).removeprefix("torch."),
        "attention_backend": backend,
        **record.metrics(),
        "prompt_len": list(workload.prompt_len),
        "output_len": workload.output_len,
        "peak_memory_bytes": peak_memory,
        "kv_pool_blocks": kv_pool_blocks,
        "kv_pool_bytes": kv_pool_bytes,
        "weight_bytes": weight_bytes,
        **extra,
        "total_wall_s": round(time.perf_counter() - began, 3),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
    }


# --- command line ------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.engine", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--workload", default="W1", choices=[*WORKLOADS, "all", "host", "smollm2"])
    parser.add_argument("--tiny", action="store_true", help="CPU-sized model and workload")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=600.0,
        help="per workload: stop generating after this long (setup included) and report",
    )
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument(
        "--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"]
    )
    parser.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"])
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--rate", type=float, default=None, help="W5 arrivals per second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--penalties",
        action="store_true",
        help="host: sample with presence and repetition penalties and top_p, not greedy",
    )
    parser.add_argument(
        "--sync-scheduling",
        action="store_true",
        help="host: read each step's tokens back before the next (off on a GPU by default)",
    )
    parser.add_argument(
        "--host-threads",
        choices=("auto", "one-cpu", "free"),
        default="auto",
        help="host: where the step thread runs beside the event loop (engine/core/host_placement.py)",
    )
    parser.add_argument(
        "--nano-vllm",
        type=Path,
        default=None,
        metavar="PATH",
        help="host: run nano-vllm's scheduler and input preparation from this checkout beside"
        " ours, taking turns (bench/nano_vllm_host.py)",
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="smollm2: runs per batch size; host: turns each"
    )
    parser.add_argument("--output-len", type=int, default=None, help="smollm2: tokens per request")
    args = parser.parse_args(argv)
    if args.max_seconds <= 0:
        parser.error("--max-seconds must be > 0")
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be > 0")
    if args.max_num_seqs < 1:
        parser.error("--max-num-seqs must be >= 1")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args


def settings_from(args: argparse.Namespace) -> RunSettings:
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if args.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = getattr(torch, args.dtype)
    batched = args.max_num_batched_tokens or (8192 if device.type == "cuda" else 1024)
    return RunSettings(
        device=device,
        dtype=dtype,
        attention_backend=args.attention_backend,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=batched,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_bytes=256 << 20,
        seed=args.seed,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.workload == "host":
        from bench.engine_host import TINY_HOST, W1_HOST, run_host

        load = TINY_HOST if args.tiny else W1_HOST
        if args.nano_vllm is not None:
            from bench.nano_vllm_host import run_side_by_side

            result = run_side_by_side(
                load, args.nano_vllm, args.repeats, args.seed, args.host_threads
            )
            result["command"] = " ".join(["python -m bench.engine", *(argv or sys.argv[1:])])
            print(json.dumps(result), flush=True)
            return 0
        result = run_host(
            load,
            seed=args.seed,
            penalties=args.penalties,
            async_scheduling=not args.sync_scheduling,
            host_threads=args.host_threads,
        )
        result["command"] = " ".join(["python -m bench.engine", *(argv or sys.argv[1:])])
        print(json.dumps(result), flush=True)
        return 0
    if args.workload == "smollm2":
        from bench.engine_smollm2 import run as run_smollm2

        result = run_smollm2(args.tiny, args.repeats, args.output_len)
        result["command"] = " ".join(["python -m bench.engine", *(argv or sys.argv[1:])])
        print(json.dumps(result), flush=True)
        return 0
    settings = settings_from(args)
    if settings.device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is available", file=sys.stderr)
        return 2
    torch.manual_seed(settings.seed)
    names = WORKLOADS if args.workload == "all" else (args.workload,)
    checkpoints: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="switchyard-bench-") as scratch:
        for name in names:
            # The cap covers writing weights and building the engine, not just generation.
            deadline = time.perf_counter() + args.max_seconds
            workload = make_workload(name, args.tiny, args.rate)
            shape = workload.shape
            if shape.name not in checkpoints:
                log(f"writing random {shape.name} weights ({settings.dtype})")
                directory = Path(scratch) / shape.name
                checkpoints[shape.name] = write_random_checkpoint(
                    directory, shape, settings.dtype, settings.device, settings.seed
                )
            result = run_workload(workload, settings, checkpoints[shape.name], deadline)
            result["command"] = " ".join(["python -m bench.engine", *(argv or sys.argv[1:])])
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
