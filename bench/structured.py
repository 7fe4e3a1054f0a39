"""Constrained against unconstrained decoding: ``python -m bench.structured``.

The bundled SmolLM2-135M-Instruct on the CPU (float32), chat prompts through its template,
``--output-len`` tokens per request at batch 1 and 16, greedy: unconstrained (EOS ignored)
and under a JSON schema whose shortest sentence is longer than ``--output-len`` tokens (an
object holding an array of at least 40 strings), so both runs generate exactly the same
number of tokens. The two modes take turns in one process, ``--repeats`` times after a
warm-up (which also compiles the schema, once). Tokens/s = generated tokens / wall time of the
``generate`` call, prefill included. Prints one JSON line: medians per batch size and mode,
the median of the per-pair ratios constrained / unconstrained, the CPU model and the load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import torch

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "notes": {"type": "array", "items": {"type": "string"}, "minItems": 40},
    },
    "required": ["title", "notes"],
    "additionalProperties": False,
}


def _run(llm: Any, prompts: list[list[int]], params: Any) -> tuple[float, int]:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(o.token_ids) for o in outputs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-len", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--download-dir", default=None)
    args = parser.parse_args(argv)
    from bench.engine_smollm2 import _prompts
    from bench.machine import cpu_model
    from engine import LLM, SamplingParams, StructuredOutput, find_bundled_model

    llm = LLM(
        find_bundled_model(),
        progress=False,
        device="cpu",
        dtype="float32",
        download_dir=args.download_dir,
        max_num_seqs=16,
    )
    free = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    spec = StructuredOutput.json_schema(SCHEMA)
    constrained = SamplingParams(temperature=0.0, max_tokens=args.output_len, structured=spec)
    load_start = os.getloadavg()[0]
    result: dict[str, Any] = {"cpu": cpu_model(), "torch_threads": torch.get_num_threads()}
    for batch in (1, 16):
        prompts = _prompts(llm.tokenizer, batch)
        _run(llm, prompts, free)
        _run(llm, prompts, constrained)  # warm-up; compiles the schema once
        runs: dict[str, list[float]] = {"unconstrained": [], "json_schema": []}
        for _ in range(args.repeats):
            for name, params in (("unconstrained", free), ("json_schema", constrained)):
                elapsed, tokens = _run(llm, prompts, params)
                assert tokens == batch * args.output_len, (name, tokens)
                runs[name].append(tokens / elapsed)
        ratios = [c / u for c, u in zip(runs["json_schema"], runs["unconstrained"], strict=True)]
        result[f"batch{batch}"] = {
            "unconstrained_tok_s": round(statistics.median(runs["unconstrained"]), 1),
            "json_schema_tok_s": round(statistics.median(runs["json_schema"]), 1),
            "ratio": round(statistics.median(ratios), 3),
            "runs": {k: [round(v, 1) for v in vs] for k, vs in runs.items()},
        }
    result["loadavg_1m"] = [load_start, os.getloadavg()[0]]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
