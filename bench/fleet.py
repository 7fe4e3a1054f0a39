"""``make bench-fleet``: prefix affinity against round robin over three engine replicas.

It starts one Redis, three ``switchyard serve`` engine processes (each a ``kind: local``
provider serving a tiny random-weight Qwen3 in its own in-process engine, one torch thread,
a KV pool of ``--pool-blocks`` blocks of 16 tokens: 192 blocks = 3,072 tokens by default, less
than the workload's 8 x 512 prompt tokens, so where a prompt is sent decides whether its prefix
is still cached), and one ``switchyard serve`` gateway in front with an ``engine_fleet`` provider
over the three.

The workload is the issue's: 8 system prompts of exactly 512 tokens (by the model's own
tokenizer) x 32 users, each user asking one short question; the 256 requests arrive interleaved
(prompt 1 user 1, prompt 2 user 1, ..., prompt 8 user 1, prompt 1 user 2, ...), sent as streams
by ``--concurrency`` clients, each asking for 8 tokens (``ignore_eos``).

In one sitting, for ``--repeat`` rounds, the fleet routes the workload with ``affinity`` and
then ``round_robin`` (a policy edit on the gateway: a new fleet, fresh prompts each run so no
run meets another's cache). Each run reports, from the replicas' own ``/metrics`` (deltas over
the run): the fleet's prefix-cache hit rate (tokens found / tokens looked up, summed over the
replicas) and each replica's share of the requests (``switchyard_requests_total``); and, at
the client, the p50 time to first token. The summary gives the medians and checks the issue's
targets: affinity's hit rate >= 2x round robin's, no replica above 1.5x the mean share.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from ports import free_port
from serve_process import launch_serve, serve_env

from gateway.providers.fleet.scrape import parse_load
from gateway.store.embedded import EmbeddedRedis

ADMIN_KEY = "sy-admin-bench-fleet-" + "0" * 20
PEPPER = "bench-fleet-pepper-0123456789"
MODEL = "tiny"
PROMPTS = 8
USERS = 32
PROMPT_TOKENS = 512
MAX_TOKENS = 8
BLOCK_SIZE = 16
# The model: small enough for three replicas on two cores, big enough that a 512-token prefill
# costs more than a cached one.
MODEL_SHAPE = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 4096,
}
WORDS = (
    "gateway", "model", "token", "cache", "prefix", "replica", "engine", "request", "stream",
    "budget", "route", "policy", "batch", "block", "kernel", "tensor", "queue", "latency",
    "answer", "prompt", "user", "system", "weather", "summary", "river", "mountain", "garden",
    "library", "window", "market", "harbour", "lantern", "compass", "meadow", "orchard",
)  # fmt: skip
QUESTIONS = (
    "What is the weather today?",
    "Summarise that in one line.",
    "Which route is fastest?",
    "How much does it cost?",
    "Can you say it again?",
    "Where is the library?",
    "Why is the sky blue?",
    "Name three colours.",
)

ENGINE_POLICY = """
providers:
  local:
    kind: local
    engine:
      model: {model}
      device: cpu
      block_size: {block_size}
      num_gpu_blocks: {pool_blocks}
      max_num_seqs: 16
      max_num_batched_tokens: 2048
      enable_prefix_caching: true
models:
  {name}:
    provider: local
"""

GATEWAY_POLICY = """
providers:
  engines:
    kind: engine_fleet
    api_key_env: BENCH_ENGINE_KEY
    timeout_s: 300
    fleet:
      replicas: [{replicas}]
      routing: {routing}
      scrape: {{interval_ms: 250, timeout_s: 2}}
models:
  {name}:
    provider: engines
"""


@dataclass(frozen=True)
class RunResult:
    routing: str
    hit_rate: float
    p50_ttft_ms: float
    shares: tuple[float, ...]  # per replica, in replica order
    seconds: float
    failed: int

    @property
    def max_share_over_mean(self) -> float:
        return max(self.shares) * len(self.shares)


class Server:
    """One ``switchyard serve`` process on a free port."""

    def __init__(self, name: str, root: Path, policy: str, env: dict[str, str]) -> None:
        self.name = name
        self.port = free_port()
        self.root = root / name
        self.root.mkdir(parents=True)
        self.policy_file = self.root / "routing_rules.yaml"
        self.policy_file.write_text(policy)
        self.log_path = self.root / "serve.log"
        self.env = serve_env(
            {
                "SWITCHYARD_HOST": "127.0.0.1",
                "SWITCHYARD_PORT": str(self.port),
                "SWITCHYARD_DATA_DIR": str(self.root / "data"),
                "SWITCHYARD_POLICY_FILE": str(self.policy_file),
                "SWITCHYARD_ADMIN_KEY": ADMIN_KEY,
                "SWITCHYARD_KEY_PEPPER": PEPPER,
                "SWITCHYARD_LOG_LEVEL": "warning",
                "SWITCHYARD_ACCESS_LOG": "false",
                "SWITCHYARD_UPSTREAM_READ_TIMEOUT_S": "300",
                **env,
            }
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> Server:
        self.process = launch_serve(self.env, self.root, self.log_path)
        return self

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                sys.exit(f"{self.name} exited; see {self.log_path}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        sys.exit(f"{self.name} was not ready within {timeout_s}s; see {self.log_path}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def admin(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)


def create_key(url: str, name: str) -> str:
    with admin(url) as client:
        response = client.post("/admin/keys", json={"name": name})
    response.raise_for_status()
    return response.json()["key"]


def system_prompts(tokenizer: Any, seed: int) -> list[str]:
    """``PROMPTS`` system prompts of exactly ``PROMPT_TOKENS`` tokens, unlike each other from
    their first words on."""
    rng = random.Random(seed)
    prompts = []
    for index in range(PROMPTS):
        words = [f"Persona {seed}-{index}:"]
        while len(tokenizer.encode(" ".join(words), add_special_tokens=False)) < PROMPT_TOKENS + 16:
            words.append(rng.choice(WORDS))
        ids = tokenizer.encode(" ".join(words), add_special_tokens=False)[:PROMPT_TOKENS]
        text = tokenizer.decode(ids)
        while (
            len(tokenizer.encode(text, add_special_tokens=False)) > PROMPT_TOKENS
        ):  # a decode may re-merge tokens
            text = text[:-1]
        prompts.append(text)
    return prompts


def workload(prompts: list[str], seed: int) -> list[dict[str, Any]]:
    """The requests in arrival order: user 1 of every prompt, then user 2, ..."""
    rng = random.Random(seed)
    requests = []
    for user in range(USERS):
        for system in prompts:
            question = f"User {user}: {rng.choice(QUESTIONS)}"
            requests.append(
                {
                    "model": MODEL,
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": question},
                    ],
                    "max_tokens": MAX_TOKENS,
                    "ignore_eos": True,
                    "temperature": 0,
                    "stream": True,
                }
            )
    return requests


def replica_counters(urls: list[str]) -> list[tuple[float, float, float]]:
    """(prefix hits, prefix queries, chat requests) of each replica, from its /metrics."""
    counters = []
    for url in urls:
        text = httpx.get(url + "/metrics", timeout=10).text
        load = parse_load(text)
        requests = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("switchyard_requests_total{") and 'route="chat.completions"' in line
        )
        counters.append((load.prefix_hits or 0.0, load.prefix_queries or 0.0, requests))
    return counters


async def _one(client: httpx.AsyncClient, body: dict[str, Any]) -> float | None:
    """Time to the first content token in seconds; None if the request failed."""
    started = time.perf_counter()
    first: float | None = None
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return None
            async for line in response.aiter_lines():
                if first is None and line.startswith("data: {"):
                    chunk = orjson.loads(line[6:])
                    if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                        first = time.perf_counter() - started
                if line == "data: [DONE]":
                    return first
    except httpx.HTTPError:
        return None
    return None


async def drive(url: str, key: str, requests: list[dict[str, Any]], concurrency: int) -> list:
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for body in requests:
        queue.put_nowait(body)
    results: list[float | None] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=300, limits=limits
    ) as client:

        async def worker() -> None:
            while not queue.empty():
                results.append(await _one(client, queue.get_nowait()))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


def run_once(
    gateway: Server, replicas: list[str], key: str, routing: str, prompts: list[str], args: Any
) -> RunResult:
    policy = GATEWAY_POLICY.format(replicas=", ".join(replicas), routing=routing, name=MODEL)
    with admin(gateway.url) as client:
        client.put("/admin/policy", content=policy).raise_for_status()
    time.sleep(1.0)  # the new fleet's first scrapes
    before = replica_counters(replicas)
    started = time.perf_counter()
    requests = workload(prompts, seed=len(prompts[0]))
    ttfts = asyncio.run(drive(gateway.url, key, requests, args.concurrency))
    seconds = time.perf_counter() - started
    time.sleep(0.3)
    after = replica_counters(replicas)
    hits = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    queries = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    counts = [a[2] - b[2] for a, b in zip(after, before, strict=True)]
    served = [t for t in ttfts if t is not None]
    return RunResult(
        routing=routing,
        hit_rate=hits / queries if queries else 0.0,
        p50_ttft_ms=statistics.median(served) * 1000 if served else float("nan"),
        shares=tuple(count / sum(counts) if sum(counts) else 0.0 for count in counts),
        seconds=seconds,
        failed=len(ttfts) - len(served),
    )


def describe(result: RunResult) -> str:
    shares = " / ".join(f"{share:.0%}" for share in result.shares)
    return (
        f"{result.routing:<12} hit rate {result.hit_rate:6.1%}  p50 TTFT "
        f"{result.p50_ttft_ms:7.1f} ms  shares {shares} (max {result.max_share_over_mean:.2f}x "
        f"mean)  {result.seconds:5.1f} s  failed {result.failed}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--pool-blocks", type=int, default=192)
    args = parser.parse_args(argv)

    from tiny_checkpoint import write_tiny_checkpoint

    from engine import Tokenizer

    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        root = Path(tmp)
        checkpoint = write_tiny_checkpoint(root / "tiny-qwen3", arch="qwen3", **MODEL_SHAPE)
        tokenizer = Tokenizer(checkpoint)
        redis = EmbeddedRedis(root / "redis", port=free_port(), appendonly=False)
        redis.start()
        servers: list[Server] = []
        try:
            shared = {"SWITCHYARD_REDIS_URL": redis.url, "OMP_NUM_THREADS": "1"}
            engine_policy = ENGINE_POLICY.format(
                model=checkpoint, block_size=BLOCK_SIZE, pool_blocks=args.pool_blocks, name=MODEL
            )
            engines = [Server(f"engine-{n}", root, engine_policy, shared) for n in range(3)]
            servers += engines
            for engine in engines:
                engine.launch()
            for engine in engines:
                engine.wait_ready()
            replicas = [engine.url for engine in engines]
            engine_key = create_key(engines[0].url, "fleet-gateway")  # one Redis: every engine
            gateway = Server(
                "gateway",
                root,
                GATEWAY_POLICY.format(replicas=", ".join(replicas), routing="affinity", name=MODEL),
                {**shared, "BENCH_ENGINE_KEY": engine_key},
            )
            servers.append(gateway)
            gateway.launch().wait_ready()
            client_key = create_key(gateway.url, "bench-client")
            print(
                f"3 engine replicas (tiny random-weight qwen3, KV pool {args.pool_blocks} blocks"
                f" x {BLOCK_SIZE} = {args.pool_blocks * BLOCK_SIZE} tokens each; workload "
                f"{PROMPTS} x {PROMPT_TOKENS}-token system prompts x {USERS} users, "
                f"concurrency {args.concurrency}); load average {os.getloadavg()[0]:.2f}",
                flush=True,
            )
            warm = workload(system_prompts(tokenizer, seed=10_000), seed=1)[:24]
            asyncio.run(drive(gateway.url, client_key, warm, args.concurrency))
            results: dict[str, list[RunResult]] = {"affinity": [], "round_robin": []}
            for round_ in range(args.repeat):
                for routing in results:
                    prompts = system_prompts(tokenizer, seed=round_ * 10 + len(results[routing]))
                    result = run_once(gateway, replicas, client_key, routing, prompts, args)
                    results[routing].append(result)
                    print(f"round {round_ + 1}: {describe(result)}", flush=True)
            return report(results)
        finally:
            for server in reversed(servers):
                server.stop()
            redis.stop()


def report(results: dict[str, list[RunResult]]) -> int:
    medians = {}
    print(
        f"\nmedians of {len(results['affinity'])} rounds (load average {os.getloadavg()[0]:.2f}):"
    )
    for routing, runs in results.items():
        medians[routing] = (
            statistics.median(r.hit_rate for r in runs),
            statistics.median(r.p50_ttft_ms for r in runs),
            statistics.median(r.max_share_over_mean for r in runs),
        )
        hit, ttft, spread = medians[routing]
        print(
            f"  {routing:<12} hit rate {hit:6.1%}  p50 TTFT {ttft:7.1f} ms  "
            f"busiest replica {spread:.2f}x the mean share"
        )
    affinity, round_robin = medians["affinity"], medians["round_robin"]
    ratio = affinity[0] / round_robin[0] if round_robin[0] else float("inf")
    worst_spread = max(r.max_share_over_mean for r in results["affinity"])
    ok = ratio >= 2.0 and worst_spread <= 1.5
    print(
        f"  hit rate affinity / round robin = {ratio:.2f}x (target >= 2x); busiest replica "
        f"under affinity in any round {worst_spread:.2f}x the mean (target <= 1.5x): "
        + ("met" if ok else "NOT met")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
