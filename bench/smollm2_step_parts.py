"""Where a batch-1 decode step of SmolLM2 spends its time on the CPU, by part of the model.

``python -m bench.smollm2_step_parts [--tokens N] [--repeats N] [--threads N]``: the bundled
SmolLM2-135M-Instruct GGUF in float32, one chat prompt, greedy, EOS ignored, through
`LLM.generate` (the synchronous engine). Forward hooks on the model's modules take each
module kind's thread CPU time, exclusive of the modules it calls; what the step spends
outside the model (scheduling, the step's inputs, the sampling setup, appending the token)
is the step's CPU time less all of them. CPU time, not wall time, so a busy machine moves
the figures less; the hooks themselves add a little to every part. One JSON line: the median
per decode step of each part (of the repeat with the least total), the CPU model and the
1-minute load average.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from typing import Any

import torch
from torch import nn

from bench.machine import cpu_model
from engine.core.llm_engine import LLM
from engine.gguf.bundled import find_bundled_model
from engine.layers.activation import SiluAndMul
from engine.layers.attention import Attention
from engine.layers.norm import RMSNorm
from engine.models.llama import DecoderAttention, DecoderLayer, DecoderMLP, LlamaModel
from engine.sampling import SamplingParams

LINEAR = "linear layers (matmul, lm_head included)"
OUTSIDE = "outside the model: schedule, inputs, sampling setup, append"


def part_of(module: nn.Module) -> str | None:
    """The part a module's own time counts to; None: not timed (its parent's)."""
    if isinstance(module, RMSNorm):
        return "RMSNorm"
    if isinstance(module, Attention):
        return "attention: KV store, gather, SDPA"
    if isinstance(module, SiluAndMul):
        return "SwiGLU"
    if isinstance(module, DecoderAttention):
        return "qkv split and RoPE"
    if isinstance(module, (DecoderLayer, DecoderMLP)):
        return "layer and MLP glue (calls, residual hand-off)"
    name = type(module).__name__
    if isinstance(module, LlamaModel) or "Embedding" in name:
        return "embedding, RoPE angles, final norm call"
    if "Linear" in name or "LMHead" in name:
        return LINEAR
    return None


class PartClock:
    """Exclusive thread CPU time per part, from forward pre- and post-hooks."""

    def __init__(self, model: nn.Module) -> None:
        self.spent: Counter[str] = Counter()
        self._open: list[tuple[str, float]] = []
        for module in model.modules():
            part = part_of(module)
            if part is not None:
                module.register_forward_pre_hook(self._enter(part))
                module.register_forward_hook(self._leave)

    def _enter(self, part: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            self._open.append((part, time.thread_time()))

        return hook

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        part, began = self._open.pop()
        spent = time.thread_time() - began
        self.spent[part] += spent
        if self._open:  # the parent's own time leaves its children out
            self.spent[self._open[-1][0]] -= spent


def measure(tokens: int, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="switchyard-parts-") as scratch:
        llm = LLM(
            find_bundled_model(),
            progress=False,
            device="cpu",
            dtype="float32",
            download_dir=scratch,
            kv_cache_bytes=256 << 20,
            enable_prefix_caching=False,
        )
        prompt = llm.tokenizer.apply_chat_template(
            [{"role": "user", "content": "Explain why the sky is blue."}],
            add_generation_prompt=True,
            tokenize=True,
        )
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        engine = llm.engine
        clock = PartClock(engine.runner.model)
        steps: list[tuple[float, dict[str, float]]] = []
        step = engine.step

        def timed_step() -> Any:
            clock.spent.clear()
            began = time.thread_time()
            deltas = step()
            steps.append((time.thread_time() - began, dict(clock.spent)))
            return deltas

        engine.step = timed_step  # type: ignore[method-assign]
        runs = []
        for _ in range(repeats):
            steps.clear()
            began = time.perf_counter()
            llm.generate([prompt], params)
            wall = time.perf_counter() - began
            decode = steps[2:]  # past the prefill and the first decode
            parts = {
                part: 1000 * statistics.median(spent.get(part, 0.0) for _, spent in decode)
                for part in decode[0][1]
            }
            step_ms = 1000 * statistics.median(total for total, _ in decode)
            parts[OUTSIDE] = step_ms - sum(parts.values())
            runs.append({"step_cpu_ms": step_ms, "tok_s": tokens / wall, "parts_ms": parts})
        llm.shutdown()
    best = min(runs, key=lambda run: run["step_cpu_ms"])
    ordered = sorted(best["parts_ms"].items(), key=lambda item: -item[1])
    return {
        "step_cpu_ms": round(best["step_cpu_ms"], 3),
        "parts_ms": {part: round(ms, 3) for part, ms in ordered},
        "tok_s_with_hooks": [round(run["tok_s"], 2) for run in runs],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.smollm2_step_parts")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    args = parser.parse_args(argv)
    if args.tokens < 4 or args.repeats < 1:
        parser.error("--tokens must be >= 4 and --repeats >= 1")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    result = {
        "workload": "smollm2 batch-1 decode step, by part",
        "threads": torch.get_num_threads(),
        "tokens": args.tokens,
        **measure(args.tokens, args.repeats),
        "cpu": cpu_model(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
