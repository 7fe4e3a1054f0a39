"""The real-model CPU workload: ``python -m bench.engine --workload smollm2 [--tiny]``.

SmolLM2-135M-Instruct, the bundled Q4_1 GGUF, on the CPU with float32 activations (the engine
keeps the weights quantized, HF dequantizes them). Against llama.cpp on the same file, and
the per-layer kernel figures: ``python -m bench.engine_quant``. Chat prompts (the model's
template) generate ``--output-len`` tokens each with EOS ignored, at batch 1 and batch 16, by
the engine and by HF ``transformers`` ``generate`` (loading the same GGUF, prompts left-padded
into one batch) in the same process, taking turns, ``--repeats`` times. Tokens/s is generated
tokens over the wall time of the whole call (prefill included) for both. Prints one JSON line:
the medians per batch size, the ratio engine / HF, every run, and the 1-minute load average
at the start and the end. ``--tiny`` (4 tokens, one run, batch 1 and 2) proves the harness,
not a speed.
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import tempfile
import time
from typing import Any

import torch

QUESTIONS = (
    "What is the capital of France?",
    "Explain why the sky is blue.",
    "Write a short poem about the sea.",
    "List five fruits and describe each one.",
    "How do airplanes stay in the air?",
    "Give me three tips for learning to cook.",
    "Describe the water cycle to a child.",
    "Tell me a fun fact about octopuses.",
    "Write a Python function that reverses a string.",
    "Why do we have seasons on Earth?",
    "Summarise the story of Cinderella.",
    "What are the benefits of regular exercise?",
    "Compare cats and dogs as pets.",
    "How does a refrigerator keep food cold?",
    "What is photosynthesis?",
    "Describe a good morning routine.",
)


def _prompts(tokenizer: Any, count: int) -> list[list[int]]:
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            add_generation_prompt=True,
            tokenize=True,
        )
        for i in range(count)
    ]


def _engine_run(llm: Any, prompts: list[list[int]], output_len: int) -> tuple[float, int]:
    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(o.token_ids) for o in outputs)


def _hf_run(
    model: Any, pad_id: int, prompts: list[list[int]], output_len: int
) -> tuple[float, int]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=output_len,
            min_new_tokens=output_len,  # EOS ignored, as on the engine side
            do_sample=False,
            pad_token_id=pad_id,
        )
    elapsed = time.perf_counter() - start
    return elapsed, (out.shape[1] - width) * len(prompts)


def run(tiny: bool, repeats: int, output_len: int | None) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from engine import LLM, find_bundled_model

    torch.manual_seed(0)
    load_before = os.getloadavg()[0]  # the box is shared: say how busy it was
    batches = (1, 2) if tiny else (1, 16)
    new_tokens = output_len or (4 if tiny else 64)
    repeats = 1 if tiny else repeats
    model_file = find_bundled_model()
    with tempfile.TemporaryDirectory(prefix="switchyard-bench-") as scratch:
        llm = LLM(
            model_file,
            progress=False,
            device="cpu",
            dtype="float32",
            download_dir=scratch,
            max_num_seqs=max(batches),
            kv_cache_bytes=256 << 20,
            enable_prefix_caching=False,  # every run computes its prompts, as HF does
        )
        hf = AutoModelForCausalLM.from_pretrained(
            model_file.parent, gguf_file=model_file.name, dtype=torch.float32
        ).eval()
        pad_id = next(iter(llm.tokenizer.eos_token_ids))
        runs: list[dict[str, Any]] = []
        for batch in batches:
            prompts = _prompts(llm.tokenizer, batch)
            _engine_run(llm, prompts, 2)  # warm-up: first-call allocations on both sides
            _hf_run(hf, pad_id, prompts, 2)
            for repeat in range(repeats):
                engine_s, engine_tokens = _engine_run(llm, prompts, new_tokens)
                hf_s, hf_tokens = _hf_run(hf, pad_id, prompts, new_tokens)
                runs.append(
                    {
                        "batch": batch,
                        "repeat": repeat,
                        "engine_tok_s": round(engine_tokens / engine_s, 2),
                        "hf_tok_s": round(hf_tokens / hf_s, 2),
                        "tokens": engine_tokens,
                    }
                )
        llm.shutdown()
    summary = {}
    for batch in batches:
        mine = [r for r in runs if r["batch"] == batch]
        engine = statistics.median(r["engine_tok_s"] for r in mine)
        reference = statistics.median(r["hf_tok_s"] for r in mine)
        summary[f"batch_{batch}"] = {
            "engine_tok_s": round(engine, 2),
            "hf_tok_s": round(reference, 2),
            "ratio": round(engine / reference, 3),
        }
    return {
        "workload": "smollm2",
        "model": model_file.name,
        "device": f"cpu ({torch.get_num_threads()} threads)",
        "dtype": "float32",
        "output_len": new_tokens,
        "repeats": repeats,
        **summary,
        "runs": runs,
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # start, end
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
    }
