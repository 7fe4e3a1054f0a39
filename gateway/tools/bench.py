"""``make bench``: gateway overhead against a fast loopback upstream.

Starts Redis, the bundled fake upstream (gateway/tools/fake_upstream.py) and one gateway worker
(uvicorn, uvloop + httptools, auth and limits on), pins the gateway to core 0 and everything
else (Redis, upstream, load generator) to core 1, then drives load with wrk at each
concurrency, straight at the upstream and through the gateway. It prints req/s and the p50/p99
latency the gateway adds, plus streaming time to first byte. Each cell is the median of
``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson

from gateway.store.embedded import EmbeddedRedis, free_port

GATEWAY_CORE = 0
LOAD_CORE = 1
ADMIN_KEY = "sy-admin-bench-" + "0" * 24
BODY = {
    "model": "bench-model",
    "messages": [{"role": "user", "content": "Say hi"}],
    "max_tokens": 8,
}

POLICY = """
providers:
  fake:
    base_url: {base_url}
    max_concurrency: 4096
models:
  bench-model:
    provider: fake
    price: {{input: 0.1, output: 0.2}}
"""

WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = [[{body}]]
wrk.headers["Content-Type"] = "application/json"
{auth}
"""


@dataclass(frozen=True)
class Run:
    rps: float
    p50_ms: float
    p99_ms: float


def _pin(core: int) -> list[str]:
    return ["taskset", "-c", str(core)] if shutil.which("taskset") and os.cpu_count() != 1 else []


def ensure_wrk() -> str:
    path = shutil.which("wrk")
    if path:
        return path
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("installing wrk with apt-get ...", file=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "-q", "wrk"], check=False, capture_output=True)
        path = shutil.which("wrk")
    if not path:
        sys.exit("wrk is needed: apt-get install -y wrk")
    return path


def _ms(text: str) -> float:
    units = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    for suffix in ("us", "ms", "s"):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * units[suffix]
    return float(text)


def run_wrk(wrk: str, url: str, script: Path, connections: int, seconds: float) -> Run:
    command = [
        *_pin(LOAD_CORE), wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency",
        "-s", str(script), url,
    ]  # fmt: skip
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    rps = p50 = p99 = float("nan")
    errors = ""
    for line in output.splitlines():
        parts = line.split()
        if line.startswith("Requests/sec:"):
            rps = float(parts[1])
        elif parts[:1] == ["50%"]:
            p50 = _ms(parts[1])
        elif parts[:1] == ["99%"]:
            p99 = _ms(parts[1])
        elif "Non-2xx" in line or "Socket errors" in line:
            errors += line.strip() + " "
    if errors:
        print(f"  warning ({url}, c={connections}): {errors}", file=sys.stderr)
    return Run(rps, p50, p99)


async def time_to_first_byte(url: str, key: str | None, count: int) -> list[float]:
    import aiohttp

    body = {**BODY, "stream": True}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    samples = []
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            started = time.perf_counter()
            async with session.post(url, json=body, headers=headers) as response:
                async for _chunk in response.content.iter_any():
                    samples.append((time.perf_counter() - started) * 1000)
                    break
                await response.read()
    return samples


def _wait_http(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell (median shown)")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--ttfb-requests", type=int, default=200)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    wrk = ensure_wrk()
    workdir = Path(tempfile.mkdtemp(prefix="switchyard-bench-"))
    processes: list[subprocess.Popen[bytes]] = []
    redis_server = EmbeddedRedis(workdir / "redis", port=free_port(), appendonly=False)
    try:
        redis_server.start()
        assert redis_server.process is not None
        if len(os.sched_getaffinity(0)) > 1:
            os.sched_setaffinity(redis_server.process.pid, {LOAD_CORE})

        upstream_port, gateway_port = free_port(), free_port()
        processes.append(
            subprocess.Popen(
                [*_pin(LOAD_CORE), sys.executable, "-m", "gateway.tools.fake_upstream",
                 "--port", str(upstream_port)],
                stdout=subprocess.DEVNULL,
            )
        )  # fmt: skip
        upstream = f"http://127.0.0.1:{upstream_port}/v1"
        policy = workdir / "routing_rules.yaml"
        policy.write_text(POLICY.format(base_url=upstream))
        env = {
            **os.environ,
            "SWITCHYARD_PORT": str(gateway_port),
            "SWITCHYARD_REDIS_URL": redis_server.url,
            "SWITCHYARD_DATA_DIR": str(workdir),
            "SWITCHYARD_ADMIN_KEY": ADMIN_KEY,
            "SWITCHYARD_POLICY_FILE": str(policy),
        }
        gateway_log = (workdir / "gateway.log").open("wb")
        processes.append(
            subprocess.Popen(
                [*_pin(GATEWAY_CORE), sys.executable, "-m", "gateway", "serve"],
                env=env,
                stdout=gateway_log,
                stderr=subprocess.STDOUT,
            )
        )
        gateway = f"http://127.0.0.1:{gateway_port}"
        _wait_http(gateway + "/healthz")
        _wait_http(upstream + "/models")
        created = httpx.post(
            gateway + "/admin/keys",
            json={"name": "bench", "rpm": 10_000_000, "tpm": 10_000_000_000},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        ).json()
        key = created["key"]
        body = orjson.dumps(BODY).decode()
        direct_script = workdir / "direct.lua"
        direct_script.write_text(WRK_SCRIPT.format(body=body, auth=""))
        gateway_script = workdir / "gateway.lua"
        gateway_script.write_text(
            WRK_SCRIPT.format(body=body, auth=f'wrk.headers["Authorization"] = "Bearer {key}"')
        )
        direct_url = upstream + "/chat/completions"
        gateway_url = gateway + "/v1/chat/completions"
        run_wrk(wrk, gateway_url, gateway_script, 16, 2)  # warm-up: pools, caches, JIT-free
        results: dict[tuple[str, int], list[Run]] = {}
        for _ in range(args.repeat):
            for level in levels:
                for name, url, script in (
                    ("direct", direct_url, direct_script),
                    ("gateway", gateway_url, gateway_script),
                ):
                    run = run_wrk(wrk, url, script, level, args.duration)
                    results.setdefault((name, level), []).append(run)
        ttfb_direct = asyncio.run(time_to_first_byte(direct_url, None, args.ttfb_requests))
        ttfb_gateway = asyncio.run(time_to_first_byte(gateway_url, key, args.ttfb_requests))
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(10)
        redis_server.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    def median(name: str, level: int, field: str) -> float:
        return statistics.median(getattr(run, field) for run in results[(name, level)])

    cpu_note = f"gateway pinned to core {GATEWAY_CORE}; upstream, Redis, wrk on core {LOAD_CORE}"
    print(f"\nSwitchyard gateway overhead (median of {args.repeat} × {args.duration:g}s wrk runs)")
    print(cpu_note)
    header = (
        f"{'conc':>5} {'direct req/s':>13} {'gateway req/s':>14} "
        f"{'direct p50':>11} {'gw p50':>8} {'added p50':>10} "
        f"{'direct p99':>11} {'gw p99':>8} {'added p99':>10}"
    )
    print(header)
    print("-" * len(header))
    for level in levels:
        d50, g50 = median("direct", level, "p50_ms"), median("gateway", level, "p50_ms")
        d99, g99 = median("direct", level, "p99_ms"), median("gateway", level, "p99_ms")
        print(
            f"{level:>5} {median('direct', level, 'rps'):>13,.0f} "
            f"{median('gateway', level, 'rps'):>14,.0f} "
            f"{d50:>9.3f}ms {g50:>6.3f}ms {g50 - d50:>8.3f}ms "
            f"{d99:>9.3f}ms {g99:>6.3f}ms {g99 - d99:>8.3f}ms"
        )
    td, tg = statistics.median(ttfb_direct), statistics.median(ttfb_gateway)
    print(
        f"\nstreaming time to first byte (median of {args.ttfb_requests}, sequential): "
        f"direct {td:.3f} ms, gateway {tg:.3f} ms, added {tg - td:.3f} ms"
    )


if __name__ == "__main__":
    main()
