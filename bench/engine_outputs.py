"""The event loop's side of streaming, alone: `python -m bench.engine_outputs`.

256 streams on uvloop, each an asyncio consumer of its outbox as `AsyncEngine.generate` reads
it; 256 steps of one token per stream, handed over `--steps-per-hand-over` at a time, as
`AsyncEngine._on_steps` does: `process_steps` (detokenization, stop checks, deltas), then the
outboxes and the consumers. No step thread and no engine, so the figure is this side's CPU
per token and nothing else. Prints one JSON line: the median and range over `--repeats` runs
(after one warm-up) of the CPU per token for the output processing alone and for the whole
hand-over.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

from bench.engine_host import clean_tokens, write_host_model
from bench.machine import cpu_model
from engine.core.async_engine import _Outbox
from engine.core.output_processor import StepOutput, process_steps
from engine.core.request_state import RequestState
from engine.sampling import SamplingParams
from engine.tokenizer import Tokenizer

STREAMS = 256
STEPS = 256
PROMPT_TOKENS = 20


@dataclass
class _Request:
    request_id: str


@dataclass
class _Seq:
    """What `process_steps` reads of a sequence."""

    request: _Request
    index: int = 0
    scheduled_at: float = 0.0


async def _one_run(
    tokenizer: Tokenizer, pool: list[int], per_hand_over: int, deliver: bool
) -> float:
    """CPU seconds per token of one run."""
    loop = asyncio.get_running_loop()
    draw = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    states: dict[str, RequestState] = {}
    outboxes: list[_Outbox] = []
    seqs = []
    for i in range(STREAMS):
        request_id = f"r{i}"
        prompt = [draw.choice(pool) for _ in range(PROMPT_TOKENS)]
        state = RequestState(request_id, None, prompt, params, tokenizer)
        outbox = _Outbox(loop)
        state.sink = outbox.put
        states[request_id] = state
        outboxes.append(outbox)
        seqs.append(_Seq(_Request(request_id)))
    steps = [
        StepOutput(
            time.monotonic(),
            seqs,
            [draw.choice(pool) for _ in range(STREAMS)],
            None,
            {p: "length" for p in range(STREAMS)} if step == STEPS - 1 else {},
        )
        for step in range(STEPS)
    ]

    async def consume(outbox: _Outbox) -> int:
        seen, finished = 0, False
        while not finished:
            for item in await outbox.take():
                assert not isinstance(item, BaseException)
                for output in item:
                    finished = output.finished
                    seen += len(output.token_ids)
        return seen

    consumers = [asyncio.ensure_future(consume(outbox)) for outbox in outboxes] if deliver else []
    await asyncio.sleep(0)
    gc.collect()
    gc.freeze()
    began = time.process_time()
    for first in range(0, STEPS, per_hand_over):
        results, _ = process_steps(steps[first : first + per_hand_over], states, None)
        if deliver:
            for state, outputs in results:
                state.sink(outputs)
            await asyncio.sleep(0)  # the consumers run
    seen = sum(await asyncio.gather(*consumers)) if deliver else STREAMS * STEPS
    spent = time.process_time() - began
    gc.unfreeze()
    assert seen == STREAMS * STEPS
    return spent / (STREAMS * STEPS)


def run(per_hand_over: int, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="switchyard-outputs-") as scratch:
        tokenizer = Tokenizer(write_host_model(Path(scratch)))
        pool = clean_tokens(tokenizer)
        figures: dict[str, list[float]] = {"process_steps": [], "with_delivery": []}
        for deliver, name in ((False, "process_steps"), (True, "with_delivery")):
            for turn in range(repeats + 1):
                us = 1e6 * uvloop.run(_one_run(tokenizer, pool, per_hand_over, deliver))
                if turn:  # the first run warms up
                    figures[name].append(round(us, 3))
    table = getattr(tokenizer, "token_bytes", None)  # None too on trees from before the table
    detokenizer = "TokenBytes" if table is not None else "DecodeStream"
    return {
        "workload": "engine-outputs",
        "streams": STREAMS,
        "steps": STEPS,
        "steps_per_hand_over": per_hand_over,
        "detokenizer": detokenizer,
        **{f"{name}_us_per_token": statistics.median(values) for name, values in figures.items()},
        "runs": figures,
        "cpu": cpu_model(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.engine_outputs", description=__doc__)
    parser.add_argument("--steps-per-hand-over", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.steps_per_hand_over < 1 or args.repeats < 1:
        parser.error("--steps-per-hand-over and --repeats must be >= 1")
    print(json.dumps(run(args.steps_per_hand_over, args.repeats)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
