"""``make bench``: gateway overhead against a fast loopback upstream.

Starts Redis, the bundled fake upstream (tests/support/fake_upstream.py) and one gateway worker
(uvicorn, uvloop + httptools, auth and limits on), pins the gateway to core 0 and everything
else (Redis, upstream, load generator) to core 1, then drives load with wrk at each
concurrency, straight at the upstream and through the gateway. It prints req/s, the p50/p99
latency the gateway adds and the gateway's CPU time per request (user + system, from ``/proc``:
the figure least moved by other load on a shared box), plus streaming time to first byte. Each
cell is the median of ``--repeat`` runs.

``--modes`` picks the gateway paths measured, interleaved within each repeat (so drift on a
shared box hits them alike): ``plain`` (tracing off, no cache: the default), ``traced`` (a
second gateway exporting every span over OTLP/HTTP to a collector that drops them),
``cache-hit`` (a deterministic request to a ``cache:`` model, answered from Redis) and
``cache-miss`` (the same model, a new question every request: lookup, upstream call, store).
``make bench-modes`` runs all four.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import fake_upstream
import httpx
import orjson
from ports import free_port

from bench.machine import cpu_model
from gateway.store.embedded import EmbeddedRedis

GATEWAY_CORE = 0
LOAD_CORE = 1
ADMIN_KEY = "sy-admin-bench-" + "0" * 24
BODY = {
    "model": "bench-model",
    "messages": [{"role": "user", "content": "Say hi"}],
    "max_tokens": 8,
}

MODES = ("plain", "traced", "cache-hit", "cache-miss")
PEPPER = "bench-pepper-" + "0" * 24  # both gateways read one key store
CACHED_BODY = {**BODY, "model": "bench-cached", "temperature": 0}

# The bench model alone, in keys every version of the policy file reads (bench_trees serves
# older checkouts, which refuse newer keys such as ``cache``).
PLAIN_POLICY = """
providers:
  fake:
    base_url: {base_url}
    max_concurrency: 4096
models:
  bench-model:
    provider: fake
    price: {{input: 0.1, output: 0.2}}
"""
POLICY = (
    PLAIN_POLICY
    + """  bench-cached:
    provider: fake
    price: {{input: 0.1, output: 0.2}}
    cache: {{ttl_s: 120, max_entries: 10000000}}
"""
)

WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = [[{body}]]
wrk.headers["Content-Type"] = "application/json"
{auth}
"""
# A new question every request (a cache miss each time): its text counts up from a random base.
WRK_MISS_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
{auth}
local counter = math.floor(os.time() * 1000 + os.clock() * 1000000)
request = function()
  counter = counter + 1
  local body = '{{"model":"bench-cached","max_tokens":8,"temperature":0,' ..
    '"messages":[{{"role":"user","content":"Say hi ' .. counter .. '"}}]}}'
  return wrk.format(nil, nil, nil, body)
end
"""


@dataclass(frozen=True)
class Run:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int = 0
    # The gateway's CPU time (user + system) per request during the run: unlike req/s, it
    # hardly moves with the machine's other load, so before/after compare on it closely.
    cpu_us: float = float("nan")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux ``/proc``; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def taskset_prefix(core: int) -> list[str]:
    """What runs a command on ``core`` alone (nothing where taskset is missing or one core)."""
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
        *taskset_prefix(LOAD_CORE), wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency",
        "-s", str(script), url,
    ]  # fmt: skip
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    run, errors = parse_wrk(output)
    if errors:
        print(f"  warning ({url}, c={connections}): {errors}", file=sys.stderr)
    return run


def parse_wrk(output: str) -> tuple[Run, str]:
    """wrk's report (``--latency``) as a ``Run``, and its error lines (empty when none)."""
    rps = p50 = p99 = float("nan")
    requests = 0
    errors = ""
    for line in output.splitlines():
        parts = line.split()
        if " requests in " in line:
            requests = int(parts[0])
        elif line.startswith("Requests/sec:"):
            rps = float(parts[1])
        elif parts[:1] == ["50%"]:
            p50 = _ms(parts[1])
        elif parts[:1] == ["99%"]:
            p99 = _ms(parts[1])
        elif "Non-2xx" in line or "Socket errors" in line:
            errors += line.strip() + " "
    return Run(rps, p50, p99, requests), errors.strip()


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


def wait_http(url: str, timeout: float = 30) -> None:
    """Until ``url`` answers (any status), or ``RuntimeError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


def start_gateway(
    workdir: Path,
    name: str,
    redis_url: str | None,
    policy: Path,
    extra: dict[str, str],
    tree: Path | None = None,
    server: tuple[str, ...] = ("-m", "gateway", "serve"),
) -> tuple[str, subprocess.Popen[bytes]]:
    """``switchyard serve`` pinned to the gateway's core, its DATA_DIR ``workdir/name`` (its log
    there too); returns its base URL and process. ``tree``: serve that checkout's code (another
    revision, for a before/after) instead of this one's. ``redis_url`` None: its own embedded
    Redis, as ``make run`` starts it. ``server``: Python's arguments for another server of the
    same app and environment (``bench/granian_serve.py``)."""
    port = free_port()
    data_dir = workdir / name
    data_dir.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        "SWITCHYARD_PORT": str(port),
        **({"SWITCHYARD_REDIS_URL": redis_url} if redis_url else {}),
        "SWITCHYARD_DATA_DIR": str(data_dir),
        "SWITCHYARD_ADMIN_KEY": ADMIN_KEY,
        "SWITCHYARD_KEY_PEPPER": PEPPER,
        "SWITCHYARD_POLICY_FILE": str(policy),
        **({"PYTHONPATH": str(tree)} if tree else {}),
        **extra,
    }
    log = (data_dir / "gateway.log").open("wb")
    process = subprocess.Popen(
        [*taskset_prefix(GATEWAY_CORE), sys.executable, *server],
        cwd=tree,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return f"http://127.0.0.1:{port}", process


def create_bench_key(gateway: str) -> str:
    """A new API key on ``gateway`` whose limits no load reaches."""
    return httpx.post(
        gateway + "/admin/keys",
        json={"name": "bench", "rpm": 10_000_000, "tpm": 10_000_000_000},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    ).json()["key"]


@dataclass
class Rig:
    """What a gateway benchmark runs on: a scratch folder, a Redis of its own, the fake upstream
    on ``upstream_port`` and ``POLICY`` on it; the processes it started (gateways too)."""

    workdir: Path
    redis: EmbeddedRedis
    upstream_port: int
    policy: Path
    processes: list[subprocess.Popen[bytes]]
    gateways: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # by URL

    @property
    def upstream(self) -> str:
        return f"http://127.0.0.1:{self.upstream_port}/v1"

    def start_gateway(
        self,
        name: str,
        extra: dict[str, str],
        *,
        tree: Path | None = None,
        redis_db: int = 0,
        policy: Path | None = None,
    ) -> str:
        """``start_gateway`` on this rig's Redis (database ``redis_db``) and policy (or
        ``policy``), stopped with the rig: its URL."""
        redis_url = self.redis.url.removesuffix("/0") + f"/{redis_db}"
        gateway, process = start_gateway(
            self.workdir, name, redis_url, policy or self.policy, extra, tree=tree
        )
        self.processes.append(process)
        self.gateways[gateway] = process
        return gateway


@contextlib.contextmanager
def bench_rig(prefix: str, *, pinned: bool) -> Iterator[Rig]:
    """A ``Rig`` for the block, then every process stopped and the folder removed. ``pinned``:
    Redis and the upstream run on the load's core (the gateways always on their own)."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    processes: list[subprocess.Popen[bytes]] = []
    redis_server = EmbeddedRedis(workdir / "redis", port=free_port(), appendonly=False)
    try:
        redis_server.start()
        assert redis_server.process is not None
        if pinned and len(os.sched_getaffinity(0)) > 1:
            os.sched_setaffinity(redis_server.process.pid, {LOAD_CORE})
        upstream_port = free_port()
        pin = taskset_prefix(LOAD_CORE) if pinned else []
        processes.append(
            subprocess.Popen(
                [*pin, sys.executable, fake_upstream.__file__, "--port", str(upstream_port)],
                stdout=subprocess.DEVNULL,
            )
        )  # fmt: skip
        policy = workdir / "routing_rules.yaml"
        policy.write_text(POLICY.format(base_url=f"http://127.0.0.1:{upstream_port}/v1"))
        yield Rig(workdir, redis_server, upstream_port, policy, processes)
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(10)
        redis_server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell (median shown)")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--ttfb-requests", type=int, default=200)
    parser.add_argument(
        "--modes", default="plain", help=f"comma list of {', '.join(MODES)} (run interleaved)"
    )
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        parser.error(f"--modes: unknown {', '.join(unknown) or '(none)'}; use {', '.join(MODES)}")
    wrk = ensure_wrk()
    with bench_rig("switchyard-bench-", pinned=True) as rig:
        workdir, upstream = rig.workdir, rig.upstream
        gateway = rig.start_gateway("plain", {})
        traced_gateway = None
        if "traced" in modes:  # its spans go to the fake upstream's dropping collector
            otel = {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rig.upstream_port}",
                "OTEL_SERVICE_NAME": "switchyard-bench",
            }
            traced_gateway = rig.start_gateway("traced", otel)
        wait_http(gateway + "/healthz")
        if traced_gateway is not None:
            wait_http(traced_gateway + "/healthz")
        wait_http(upstream + "/models")
        key = create_bench_key(gateway)
        auth = f'wrk.headers["Authorization"] = "Bearer {key}"'
        body = orjson.dumps(BODY).decode()
        direct_script = workdir / "direct.lua"
        direct_script.write_text(WRK_SCRIPT.format(body=body, auth=""))
        gateway_script = workdir / "gateway.lua"
        gateway_script.write_text(WRK_SCRIPT.format(body=body, auth=auth))
        hit_script = workdir / "cache-hit.lua"
        hit_script.write_text(WRK_SCRIPT.format(body=orjson.dumps(CACHED_BODY).decode(), auth=auth))
        miss_script = workdir / "cache-miss.lua"
        miss_script.write_text(WRK_MISS_SCRIPT.format(auth=auth))
        direct_url = upstream + "/chat/completions"
        # Each cell: its name, the gateway (None: the upstream straight), its URL and script.
        cells: list[tuple[str, str | None, str, Path]] = [
            ("direct", None, direct_url, direct_script)
        ]
        for mode in modes:
            served_by = traced_gateway if mode == "traced" else gateway
            assert served_by is not None
            script = {"cache-hit": hit_script, "cache-miss": miss_script}.get(mode, gateway_script)
            cells.append((mode, served_by, served_by + "/v1/chat/completions", script))
        for _, _, url, script in cells[1:]:  # warm-up: pools, caches; the cache-hit entry stored
            run_wrk(wrk, url, script, 16, 2)
        results: dict[tuple[str, int], list[Run]] = {}
        for _ in range(args.repeat):
            for level in levels:
                for name, served_by, url, script in cells:
                    pid = rig.gateways[served_by].pid if served_by else None
                    cpu_before = process_cpu_s(pid) if pid else float("nan")
                    run = run_wrk(wrk, url, script, level, args.duration)
                    if pid and run.requests:
                        cpu_s = process_cpu_s(pid) - cpu_before
                        run = replace(run, cpu_us=cpu_s / run.requests * 1e6)
                    results.setdefault((name, level), []).append(run)
        ttfb: dict[str, list[float]] = {
            "direct": asyncio.run(time_to_first_byte(direct_url, None, args.ttfb_requests))
        }
        for name, _, url, _ in cells[1:]:
            if name in ("plain", "traced"):
                ttfb[name] = asyncio.run(time_to_first_byte(url, key, args.ttfb_requests))
    _report(args, levels, [cell[0] for cell in cells], results, ttfb)


def _report(
    args: argparse.Namespace,
    levels: list[int],
    names: list[str],
    results: dict[tuple[str, int], list[Run]],
    ttfb: dict[str, list[float]],
) -> None:
    def median(name: str, level: int, field: str) -> float:
        return statistics.median(getattr(run, field) for run in results[(name, level)])

    cpu_note = f"gateway pinned to core {GATEWAY_CORE}; upstream, Redis, wrk on core {LOAD_CORE}"
    print(f"\nSwitchyard gateway overhead (median of {args.repeat} × {args.duration:g}s wrk runs)")
    print(f"CPU: {cpu_model()}; {cpu_note}")
    header = (
        f"{'conc':>5} {'path':>11} {'req/s':>10} {'p50':>9} {'added p50':>10} "
        f"{'p99':>9} {'added p99':>10} {'gw cpu/req':>11}"
    )
    print(header)
    print("-" * len(header))
    for level in levels:
        d50, d99 = median("direct", level, "p50_ms"), median("direct", level, "p99_ms")
        for name in names:
            p50, p99 = median(name, level, "p50_ms"), median(name, level, "p99_ms")
            added50 = f"{p50 - d50:>8.3f}ms" if name != "direct" else f"{'':>10}"
            added99 = f"{p99 - d99:>8.3f}ms" if name != "direct" else f"{'':>10}"
            cpu = f"{median(name, level, 'cpu_us'):>9.0f}us" if name != "direct" else ""
            print(
                f"{level:>5} {name:>11} {median(name, level, 'rps'):>10,.0f} "
                f"{p50:>7.3f}ms {added50} {p99:>7.3f}ms {added99} {cpu}"
            )
        if "cache-hit" in names and "cache-miss" in names:
            ratio = median("cache-miss", level, "p50_ms") / median("cache-hit", level, "p50_ms")
            print(f"{level:>5} {'':>11} cache miss p50 / hit p50 = {ratio:.2f}")
    line = ", ".join(f"{name} {statistics.median(s):.3f} ms" for name, s in ttfb.items())
    print(f"\nstreaming time to first byte (median of {args.ttfb_requests}, sequential): {line}")


if __name__ == "__main__":
    main()
