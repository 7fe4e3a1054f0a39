"""``python -m bench.soak``: a fixed request rate for a set time through a real gateway process,
printing the gateway's RSS over time and failing if it keeps growing after warm-up.

It starts a fake upstream and ``switchyard serve`` (embedded Redis in a temp dir) as
subprocesses, creates a key, then sends requests on an open-loop schedule (one every
1/rate seconds, whatever the answers do), a mix of streamed and plain chat completions.
Every ``--sample`` seconds it prints elapsed time, RSS, requests, errors and latency.

The verdict: RSS growth from the end of warm-up to the end, and the slope of a least-squares
line through the post-warm-up samples; both must stay under ``--max-growth-mb``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import fake_upstream
from ports import free_port

POLICY = """
providers:
  fake:
    base_url: http://127.0.0.1:{port}/v1
models:
  soak-model:
    provider: fake
    price: {{input: 1, output: 2}}
"""
MESSAGES = [{"role": "user", "content": "soak " * 20}]


@dataclass
class Sample:
    elapsed_s: float
    rss_mb: float
    sent: int
    ok: int
    errors: int
    p50_ms: float
    p99_ms: float


@dataclass
class SoakResult:
    samples: list[Sample] = field(default_factory=list)
    warmup_s: float = 0.0
    sent: int = 0
    ok: int = 0
    errors: int = 0

    def after_warmup(self) -> list[Sample]:
        return [s for s in self.samples if s.elapsed_s >= self.warmup_s]

    @property
    def growth_mb(self) -> float:
        steady = self.after_warmup()
        return steady[-1].rss_mb - steady[0].rss_mb if len(steady) >= 2 else 0.0

    @property
    def slope_mb_per_min(self) -> float:
        steady = self.after_warmup()
        if len(steady) < 3:
            return 0.0
        times = [s.elapsed_s / 60 for s in steady]
        return statistics.linear_regression(times, [s.rss_mb for s in steady]).slope


def rss_mb(pid: int) -> float:
    """Resident set size of a process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Processes:
    """The fake upstream and the gateway, started and stopped together."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.upstream_port = free_port()
        self.gateway_port = free_port()
        self.admin_key = "sy-admin-soak-" + secrets.token_hex(16)
        self.children: list[subprocess.Popen[bytes]] = []
        self.gateway: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        python = sys.executable
        log = (self.workdir / "processes.log").open("ab")
        self.children.append(
            subprocess.Popen(
                [python, fake_upstream.__file__, "--port", str(self.upstream_port)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        policy = self.workdir / "routing_rules.yaml"
        policy.write_text(POLICY.format(port=self.upstream_port))
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
        env.update(
            SWITCHYARD_PORT=str(self.gateway_port),
            SWITCHYARD_DATA_DIR=str(self.workdir / "data"),
            SWITCHYARD_POLICY_FILE=str(policy),
            SWITCHYARD_ADMIN_KEY=self.admin_key,
            SWITCHYARD_ACCESS_LOG="false",
        )
        self.gateway = subprocess.Popen(
            [python, "-m", "gateway", "serve"],
            cwd=self.workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.children.append(self.gateway)
        log.close()

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in self.children:
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


async def _wait_ready(session: aiohttp.ClientSession, base: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            async with session.get(base + "/readyz") as reply:
                if reply.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError("the gateway did not become ready")


async def _create_key(session: aiohttp.ClientSession, base: str, admin_key: str) -> str:
    headers = {"Authorization": f"Bearer {admin_key}"}
    async with session.post(base + "/admin/keys", json={"name": "soak"}, headers=headers) as r:
        if r.status != 201:
            raise RuntimeError(f"cannot create a key: {r.status} {await r.text()}")
        return (await r.json())["key"]


class Load:
    def __init__(self, session: aiohttp.ClientSession, base: str, key: str, stream_ratio: float):
        self.session = session
        self.url = base + "/v1/chat/completions"
        self.headers = {"Authorization": f"Bearer {key}"}
        self.stream_every = round(1 / stream_ratio) if stream_ratio > 0 else 0
        self.sent = self.ok = self.errors = 0
        self.latencies_ms: list[float] = []

    async def one(self, index: int) -> None:
        stream = bool(self.stream_every) and index % self.stream_every == 0
        body = {"model": "soak-model", "messages": MESSAGES, "max_tokens": 16, "stream": stream}
        started = time.perf_counter()
        self.sent += 1
        try:
            async with self.session.post(self.url, json=body, headers=self.headers) as reply:
                payload = await reply.read()
                good = reply.status == 200 and (not stream or payload.endswith(b"[DONE]\n\n"))
        except (TimeoutError, aiohttp.ClientError):
            good = False
        self.latencies_ms.append((time.perf_counter() - started) * 1000)
        if good:
            self.ok += 1
        else:
            self.errors += 1

    def take_latencies(self) -> tuple[float, float]:
        values, self.latencies_ms = sorted(self.latencies_ms), []
        if not values:
            return 0.0, 0.0
        return values[len(values) // 2], values[min(len(values) - 1, int(len(values) * 0.99))]


async def soak(
    rate: float,
    duration_s: float,
    *,
    warmup_s: float,
    sample_s: float,
    stream_ratio: float = 0.5,
    out: object = sys.stdout,
) -> SoakResult:
    result = SoakResult(warmup_s=warmup_s)
    with tempfile.TemporaryDirectory(prefix="switchyard-soak-") as tmp:
        processes = Processes(Path(tmp))
        processes.start()
        try:
            base = f"http://127.0.0.1:{processes.gateway_port}"
            connector = aiohttp.TCPConnector(limit=256)
            timeout = aiohttp.ClientTimeout(total=30)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                await _wait_ready(session, base)
                key = await _create_key(session, base, processes.admin_key)
                load = Load(session, base, key, stream_ratio)
                assert processes.gateway is not None
                await _run(load, processes.gateway.pid, rate, duration_s, sample_s, result, out)
                result.sent, result.ok, result.errors = load.sent, load.ok, load.errors
        finally:
            processes.stop()
    return result


async def _run(
    load: Load,
    pid: int,
    rate: float,
    duration_s: float,
    sample_s: float,
    result: SoakResult,
    out: object,
) -> None:
    print("elapsed_s  rss_mb  sent     ok  errors  p50_ms  p99_ms", file=out, flush=True)  # type: ignore[call-overload]
    tasks: set[asyncio.Task[None]] = set()
    start = time.monotonic()
    next_sample = sample_s
    index = 0
    while True:
        elapsed = time.monotonic() - start
        if elapsed >= duration_s:
            break
        due = int(elapsed * rate) + 1  # open loop: as many sent as the schedule says
        while index < due:
            task = asyncio.create_task(load.one(index))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            index += 1
        if elapsed >= next_sample:
            p50, p99 = load.take_latencies()
            sample = Sample(elapsed, rss_mb(pid), load.sent, load.ok, load.errors, p50, p99)
            result.samples.append(sample)
            print(
                f"{sample.elapsed_s:9.0f}  {sample.rss_mb:6.1f}  {sample.sent:6d} {sample.ok:6d}"
                f"  {sample.errors:6d}  {sample.p50_ms:6.1f}  {sample.p99_ms:6.1f}",
                file=out,  # type: ignore[call-overload]
                flush=True,
            )
            next_sample += sample_s
        await asyncio.sleep(min(0.01, 1 / rate))
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    result.samples.append(
        Sample(duration_s, rss_mb(pid), load.sent, load.ok, load.errors, *load.take_latencies())
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100, help="requests per second")
    parser.add_argument("--duration", type=float, default=600, help="seconds")
    parser.add_argument("--warmup", type=float, default=None, help="seconds (default 20%%)")
    parser.add_argument("--sample", type=float, default=10, help="seconds between RSS samples")
    parser.add_argument("--stream-ratio", type=float, default=0.5)
    parser.add_argument("--max-growth-mb", type=float, default=20)
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.duration <= 0 or not 0 <= args.stream_ratio <= 1:
        parser.error("--rate and --duration must be positive, --stream-ratio in [0, 1]")
    warmup = args.warmup if args.warmup is not None else args.duration * 0.2
    result = asyncio.run(
        soak(args.rate, args.duration, warmup_s=warmup, sample_s=args.sample,
             stream_ratio=args.stream_ratio)
    )  # fmt: skip
    steady = result.after_warmup()
    print(
        f"requests {result.sent} ok {result.ok} errors {result.errors}; RSS after warm-up "
        f"{steady[0].rss_mb:.1f} -> {steady[-1].rss_mb:.1f} MB (growth {result.growth_mb:+.1f} MB,"
        f" slope {result.slope_mb_per_min:+.2f} MB/min)"
    )
    flat = (
        result.growth_mb <= args.max_growth_mb
        and result.slope_mb_per_min * (args.duration / 60) <= args.max_growth_mb
    )
    print("RSS flat" if flat else f"RSS GREW more than {args.max_growth_mb} MB")
    return 0 if flat and result.errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
