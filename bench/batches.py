"""``python -m bench.batches``: interactive latency on the local engine while a batch runs
against the same key, against the same requests with no batch (docs/benchmarks.md).

One gateway process serves the bundled SmolLM2-135M-Instruct on the in-process engine (CPU),
on a Redis of its own. Rounds alternate the two phases, idle first in even rounds and busy first
in odd ones, so a drift of the machine over the run falls on both alike:

- idle: ``--requests`` chat completions one after another, ``--gap-s`` apart (``--max-tokens``
  each, greedy);
- busy: a batch of ``--lines`` lines of the same key and model is created, and once its first
  line is answered the same requests are sent; then the batch is cancelled, and the phase ends
  when it is ``cancelled`` (nothing of it runs in the next idle phase).

It prints the CPU model, the p50 and p90 of each phase over all rounds, the ratio of the p50s,
and the batch lines answered per second of busy phase (what the batch got while yielding).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import orjson
from openai import OpenAI
from ports import free_port
from serve_process import launch_serve, serve_env

from bench.machine import cpu_model
from gateway.store.embedded import EmbeddedRedis

ADMIN_KEY = "sy-admin-bench-0123456789abcdef"
MODEL = "local-smollm2"
POLICY = """
providers:
  local:
    kind: local
    engine:
      device: cpu
      max_num_seqs: {seqs}
      max_num_batched_tokens: 512
models:
  local-smollm2:
    provider: local
    price: {{input: 0.1, output: 0.2, batch: {{input: 0.05, output: 0.1}}}}
"""
FINAL = ("completed", "failed", "expired", "cancelled")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def batch_file(lines: int, max_tokens: int) -> bytes:
    rows = (
        orjson.dumps(
            {
                "custom_id": f"q{n}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": MODEL,
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "messages": [{"role": "user", "content": f"Write a word about {n}."}],
                },
            }
        )
        for n in range(lines)
    )
    return b"\n".join(rows) + b"\n"


def interactive(client: OpenAI, count: int, max_tokens: int, gap_s: float = 0.0) -> list[float]:
    seconds = []
    for n in range(count):
        time.sleep(gap_s)  # a client's pause between requests: the batch's chance
        started = time.perf_counter()
        client.chat.completions.create(
            model=MODEL,
            max_tokens=max_tokens,
            temperature=0,
            messages=[{"role": "user", "content": f"Say hello to number {n}."}],
        )
        seconds.append(time.perf_counter() - started)
    return seconds


def busy_phase(
    client: OpenAI, data: bytes, count: int, max_tokens: int, gap_s: float
) -> tuple[list[float], int, float]:
    """The interactive requests while a batch runs; its lines answered, and the phase's time."""
    uploaded = client.files.create(file=("bench.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    started = time.monotonic()
    while (batch.request_counts is None or batch.request_counts.completed == 0) and (
        time.monotonic() - started < 120
    ):
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    phase_started = time.monotonic()
    done_before = batch.request_counts.completed if batch.request_counts else 0
    seconds = interactive(client, count, max_tokens, gap_s)
    batch = client.batches.retrieve(batch.id)
    done = (batch.request_counts.completed if batch.request_counts else 0) - done_before
    elapsed = time.monotonic() - phase_started
    client.batches.cancel(batch.id)
    while batch.status not in FINAL:
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    client.files.delete(uploaded.id)
    return seconds, done, elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=8, help="interactive requests a phase")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--gap-s", type=float, default=1.0, help="pause before each request")
    parser.add_argument("--seqs", type=int, default=8, help="the engine's max_num_seqs")
    parser.add_argument("--local-share", default="0.5", help="SWITCHYARD_BATCH_LOCAL_SHARE")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="bench-batches-"))
    redis = EmbeddedRedis(workdir / "redis", port=free_port(), appendonly=False)
    redis.start()
    port = free_port()
    policy = workdir / "routing_rules.yaml"
    policy.write_text(POLICY.format(seqs=args.seqs))
    env = serve_env(
        {
            "SWITCHYARD_PORT": str(port),
            "SWITCHYARD_DATA_DIR": str(workdir / "data"),
            "SWITCHYARD_REDIS_URL": redis.url,
            "SWITCHYARD_POLICY_FILE": str(policy),
            "SWITCHYARD_ADMIN_KEY": ADMIN_KEY,
            "SWITCHYARD_ACCESS_LOG": "false",
            "SWITCHYARD_LOG_LEVEL": "warning",
            "SWITCHYARD_BATCH_POLL_INTERVAL_S": "0.1",
            "SWITCHYARD_BATCH_LOCAL_SHARE": args.local_share,
            "SWITCHYARD_BATCH_MAX_FILE_BYTES": str(512 * 1024 * 1024),
        }
    )
    process = launch_serve(env, workdir, workdir / "gateway.log")
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:  # ready once the engine has loaded the model (converted once, the 1st time)
            try:
                ready = httpx.get(base + "/readyz", timeout=2).json()
                if ready["checks"].get("local_engine") == "ready":
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((workdir / "gateway.log").read_text()[-3000:])
            time.sleep(0.5)
        key = httpx.post(
            base + "/admin/keys",
            json={"name": "bench"},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        ).json()["key"]
        client = OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=600)
        interactive(client, 2, args.max_tokens)  # warm-up
        data = batch_file(args.lines, args.max_tokens)
        idle: list[float] = []
        busy: list[float] = []
        answered, busy_s = 0, 0.0
        for round_ in range(args.rounds):
            for phase in ("idle", "busy") if round_ % 2 == 0 else ("busy", "idle"):
                if phase == "idle":
                    idle += interactive(client, args.requests, args.max_tokens, args.gap_s)
                else:
                    seconds, done, elapsed = busy_phase(
                        client, data, args.requests, args.max_tokens, args.gap_s
                    )
                    busy += seconds
                    answered += done
                    busy_s += elapsed
        load = " ".join(f"{value:.2f}" for value in os.getloadavg())
        print(f"cpu: {cpu_model()}; load average at the end: {load}")
        print(
            f"engine max_num_seqs {args.seqs}, batch of {args.lines} lines, local share "
            f"{args.local_share}; {args.rounds} rounds x {args.requests} requests of "
            f"{args.max_tokens} tokens, {args.gap_s} s apart"
        )
        for name, values in (("idle", idle), ("with the batch", busy)):
            print(
                f"interactive {name}: p50 {statistics.median(values) * 1000:.0f} ms, "
                f"p90 {percentile(values, 0.9) * 1000:.0f} ms ({len(values)} requests)"
            )
        ratio = statistics.median(busy) / statistics.median(idle)
        print(f"p50 with the batch / idle: {ratio:.2f}")
        print(f"batch lines answered meanwhile: {answered / busy_s:.2f} lines/s")
    finally:
        process.terminate()
        try:
            process.wait(60)
        except Exception:
            process.kill()
        redis.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
