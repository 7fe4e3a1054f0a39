"""The bundled SmolLM2-135M-Instruct Q4_1 GGUF: the engine kept quantized against llama.cpp
on the same file, interleaved in one sitting, and the per-layer kernel figures behind the
engine's load-time choice.

    python -m bench.engine_quant [--llama-python PATH] [--repeats 5] [--output-len 64]

- kernels: every distinct linear shape of the model at 1, 16 and 256 rows through
  `F.linear` on the float32 weight, oneDNN's packed copy, the C kernel at each thread count
  and a transient dequantization + `F.linear`; microseconds per call (fastest of 10), and
  what the engine chose at load for that shape (its cache file).
- CPU milliseconds per token (all threads of each process) beside every rate: on a shared
  box the wall-clock rates follow the load, the CPU cost much less.
- engine vs llama.cpp, taking turns `--repeats` times: batch 1 (one chat prompt, greedy,
  `--output-len` tokens, EOS ignored), 16 requests (the engine: one concurrent batch;
  llama.cpp: one after another, as its server runs one sequence), and the prefill of a
  1,000-token prompt (engine: time to the first token, one token generated; llama.cpp:
  `eval` of the prompt). Tokens/s are generated tokens over the wall time of the call.
  llama.cpp runs in `--llama-python` (a Python where `llama-cpp-python` is installed), as a
  subprocess (bench/llama_cpp.py); without it the engine's figures alone are printed.

Prints one JSON line: medians, ratios, every run, the CPU model and flags, the 1-minute
load average at the start and the end (the box may be shared: read figures with it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

QUESTION = "Explain why the sky is blue."
PREFILL_TOKENS = 1000
KERNEL_REPEATS = 10


def cpu_description() -> dict[str, str]:
    """`lscpu`'s model name and flags."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return {"model": "unknown", "flags": ""}
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return {
        "model": fields.get("Model name", "unknown").strip(),
        "flags": fields.get("Flags", "").strip(),
        "cpus": fields.get("CPU(s)", "").strip(),
    }


def _best_us(call: Any) -> float:
    call()
    best = float("inf")
    for _ in range(KERNEL_REPEATS):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return round(best * 1e6, 1)


def kernel_figures(model: torch.nn.Module, cache_dir: Path) -> list[dict[str, Any]]:
    """Every candidate on every distinct quantized shape of the loaded model."""
    from engine.layers import cpu_matmul
    from engine.layers.kernel_choice import ROW_CLASSES, KernelChooser

    chooser = KernelChooser(cache_dir)
    chosen = chooser.cache
    seen: dict[tuple[int, int, int, int], Any] = {}
    for module in model.modules():
        weight = getattr(module, "quantized", None)
        if weight is not None and hasattr(module, "method"):
            seen.setdefault((*weight.shape, weight.bits, weight.group_size), weight)
    figures = []
    for (n, k, bits, _group), weight in seen.items():
        dense = weight.dequantize()
        packed = cpu_matmul.pack(dense)
        picks = next(
            (v for key, v in chosen.items() if key.startswith(f"quantized:{n}x{k}:{bits}b")), None
        )
        for index, rows in enumerate(ROW_CLASSES):
            x = torch.randn(rows, k)
            entry: dict[str, Any] = {"shape": f"{n}x{k}", "format": weight.describe(), "rows": rows}
            entry["f_linear_us"] = _best_us(lambda: F.linear(x, dense))  # noqa: B023
            if packed is not None:
                entry["onednn_us"] = _best_us(
                    lambda: cpu_matmul.packed_linear(x, packed, None)  # noqa: B023
                )
            for method in chooser.quantized_candidates(weight):
                entry[f"{method.name}_us"] = _best_us(lambda: method(x, None))  # noqa: B023
            entry["chosen_at_load"] = picks[index] if picks else None
            figures.append(entry)
            print(json.dumps(entry), file=sys.stderr, flush=True)  # a cut run keeps them
    return figures


def _chat_prompt(tokenizer: Any) -> list[int]:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=True
    )


def _long_prompt(tokenizer: Any) -> list[int]:
    text = " ".join(
        f"Paragraph {i}: the quick brown fox jumps over the lazy dog near the river bank."
        for i in range(200)
    )
    return tokenizer.encode(text)[:PREFILL_TOKENS]


def _engine_generate(
    llm: Any, prompts: list[list[int]], new_tokens: int
) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of all the process's threads, generated tokens)."""
    from engine.sampling import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    start, cpu_start = time.perf_counter(), time.process_time()
    outputs = llm.generate(prompts, params)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return seconds, cpu, sum(len(o.token_ids) for o in outputs)


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def run(args: argparse.Namespace) -> dict[str, Any]:
    from engine.core.llm_engine import LLM
    from engine.gguf.bundled import find_bundled_model

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
    load_before = os.getloadavg()[0]
    model_file = find_bundled_model()
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()  # llama.cpp gets as many
    with tempfile.TemporaryDirectory(prefix="switchyard-bench-") as scratch:
        cache_dir = Path(args.kernel_cache_dir or Path(scratch) / "kernels")
        start = time.perf_counter()
        llm = LLM(
            model_file,
            progress=False,
            device="cpu",
            download_dir=str(Path(scratch) / "models"),
            kernel_cache_dir=str(cache_dir),
            max_num_seqs=16,
            max_num_batched_tokens=2048,
            kv_cache_bytes=256 << 20,
            enable_prefix_caching=False,
        )
        load_s = time.perf_counter() - start
        runner = llm.engine.runner
        result: dict[str, Any] = {
            "workload": "smollm2-quantized-vs-llama.cpp",
            "model": model_file.name,
            "cpu": cpu_description(),
            "threads": threads,
            "engine_load_s": round(load_s, 2),
            "engine_weight_bytes": runner.weight_bytes,
        }
        if not args.skip_kernels:
            result["kernels"] = kernel_figures(runner.model, cache_dir)
        chat = _chat_prompt(llm.tokenizer)
        long = _long_prompt(llm.tokenizer)
        llama = None
        if args.llama_python:
            from bench.llama_cpp import LlamaCpp

            llama = LlamaCpp(args.llama_python, model_file, threads, args.n_batch, args.n_ubatch)
            result["llama_cpp"] = {**llama.info, **llama.settings}
        runs: list[dict[str, Any]] = []
        _engine_generate(llm, [chat], 2)  # warm-up
        if llama is not None:
            llama.request(op="generate", prompt=chat, new_tokens=2)
        for repeat in range(args.repeats):
            row: dict[str, Any] = {"repeat": repeat, "load_avg_1m": os.getloadavg()[0]}
            seconds, cpu, tokens = _engine_generate(llm, [chat], args.output_len)
            row["engine_b1_tok_s"] = tokens / seconds
            row["engine_b1_cpu_ms_per_tok"] = cpu / tokens * 1e3
            seconds, cpu, tokens = _engine_generate(llm, [chat] * 16, args.output_len)
            row["engine_16_tok_s"] = tokens / seconds
            row["engine_16_cpu_ms_per_tok"] = cpu / tokens * 1e3
            seconds, cpu, _ = _engine_generate(llm, [long], 1)
            row["engine_prefill_tok_s"] = len(long) / seconds
            row["engine_prefill_cpu_ms_per_tok"] = cpu / len(long) * 1e3
            if llama is not None:
                answer = llama.request(op="generate", prompt=chat, new_tokens=args.output_len)
                row["llama_b1_tok_s"] = len(answer["tokens"]) / answer["seconds"]
                row["llama_b1_cpu_ms_per_tok"] = answer["cpu_seconds"] / len(answer["tokens"]) * 1e3
                total_s = total_cpu = total = 0
                for _ in range(args.sequential):
                    answer = llama.request(op="generate", prompt=chat, new_tokens=args.output_len)
                    total_s += answer["seconds"]
                    total_cpu += answer["cpu_seconds"]
                    total += len(answer["tokens"])
                row["llama_16_sequential_tok_s"] = total / total_s
                row["llama_16_cpu_ms_per_tok"] = total_cpu / total * 1e3
                answer = llama.request(op="prefill", prompt=long)
                row["llama_prefill_tok_s"] = len(long) / answer["seconds"]
                row["llama_prefill_cpu_ms_per_tok"] = answer["cpu_seconds"] / len(long) * 1e3
            runs.append({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()})
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
        if llama is not None:
            llama.close()
        llm.shutdown()
    summary = {
        key: _median([r[key] for r in runs if key in r]) for key in runs[0] if "_tok_s" in key
    }
    if llama is not None:
        for ours, theirs in (
            ("engine_b1_tok_s", "llama_b1_tok_s"),
            ("engine_16_tok_s", "llama_16_sequential_tok_s"),
            ("engine_prefill_tok_s", "llama_prefill_tok_s"),
        ):
            summary[f"ratio_{ours.removeprefix('engine_').removesuffix('_tok_s')}"] = round(
                summary[ours] / summary[theirs], 3
            )
    result.update(
        {
            "output_len": args.output_len,
            "prefill_prompt_tokens": len(long),
            "medians": summary,
            "runs": runs,
            "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "torch": torch.__version__,
        }
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-python", help="a Python with llama-cpp-python installed")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--n-batch", type=int, default=1, help="llama.cpp's n_batch")
    parser.add_argument("--n-ubatch", type=int, default=1, help="llama.cpp's n_ubatch")
    parser.add_argument(
        "--sequential",
        type=int,
        default=16,
        help="llama.cpp requests run one after another for its 16-request figure (its rate)",
    )
    parser.add_argument(
        "--threads", type=int, help="torch's threads and llama.cpp's (default: torch's own)"
    )
    parser.add_argument("--kernel-cache-dir", help="reuse a kernel cache (default: a fresh one)")
    parser.add_argument("--skip-kernels", action="store_true", help="end-to-end figures only")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
