"""``make bench-run``: the gateway as ``make run`` serves it, with its Redis's CPU per request.

``make run`` starts ``switchyard serve`` with everything it runs in one place: the gateway, its
embedded Redis (AOF on, a unix socket) and the usage exporter into SQLite. Here that whole
stack is pinned to core 0 (``taskset``; the embedded Redis inherits it), the fake upstream and
the load generators to core 1, so the gateway and its Redis share one core as they do under
``make run`` (``make bench`` instead gives Redis the load's core).

For each run it reads the embedded Redis's ``INFO cpu`` and ``INFO commandstats`` before and
after (once the exporter has emptied the usage buffer, so the export of the run's events counts
too), and prints, per concurrency: req/s, p50/p99 and what the gateway adds to them, the
gateway's CPU per request (``/proc``), Redis's CPU per request (user + system, from ``INFO``),
and per concurrency each Redis command's calls per request and µs per call (commands that
scripts call are counted apart, inside their script's time) and what the SLOWLOG caught over
1 ms. Streams: 16 clients
each reading whole streams for the run's length (aiohttp, on the load's core): streams/s and
the time to first byte the gateway adds. Each cell is the median of ``--repeat`` runs; the load
average is printed beside the figures (the box may be shared). With ``--trees``, each tree after
the first is also compared with it round by round: the median of the rounds' ratios of gateway +
Redis CPU per request (with their quartiles, and in how many rounds it cost less) and of req/s.
On a box whose speed drifts within a minute, many short rounds (``--repeat 30 --duration 2``)
resolve a difference of a few percent that the medians of each tree's runs do not.

``--servers uvicorn,granian`` serves the same app under granian as well (``bench/granian_serve.py``:
built as ``switchyard serve`` builds it, same settings, embedded Redis and policy; one worker on
uvloop), on the same core, interleaved with uvicorn round by round: a row per server. granian
is no dependency of the gateway: ``pip install granian``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import orjson
import redis

from bench.gateway import (
    BODY,
    GATEWAY_CORE,
    LOAD_CORE,
    PLAIN_POLICY,
    WRK_SCRIPT,
    Rig,
    Run,
    bench_rig,
    ensure_wrk,
    process_cpu_s,
    run_wrk,
    start_gateway,
    wait_http,
)
from bench.granian_serve import GRANIAN_MISSING, granian_version
from bench.machine import cpu_model

ADMIN_HEADERS = {"Authorization": "Bearer sy-admin-bench-" + "0" * 24}

# What each server runs (Python's arguments); the environment is start_gateway's for both.
SERVERS: dict[str, tuple[str, ...]] = {
    "uvicorn": ("-m", "gateway", "serve"),  # the product's server, as `make run` starts it
    "granian": ("-m", "bench.granian_serve"),
}


@dataclass(frozen=True)
class RedisSample:
    """A Redis server's CPU seconds so far and its ``commandstats``: command -> (calls, µs)."""

    cpu_s: float
    commands: dict[str, tuple[int, int]]

    @classmethod
    def of(cls, client: redis.Redis) -> RedisSample:
        cpu = client.info("cpu")
        stats = client.info("commandstats")
        commands = {
            name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
            for name, v in stats.items()
        }
        return cls(float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), commands)

    def since(self, before: RedisSample) -> RedisSample:
        commands = {}
        for name, (calls, usec) in self.commands.items():
            old_calls, old_usec = before.commands.get(name, (0, 0))
            if calls > old_calls:
                commands[name] = (calls - old_calls, usec - old_usec)
        return RedisSample(self.cpu_s - before.cpu_s, commands)


@dataclass
class Served:
    """One ``switchyard serve`` with its embedded Redis, as ``make run`` starts it."""

    name: str
    url: str
    pid: int
    data_dir: Path
    key: str = ""
    _redis: redis.Redis | None = field(default=None, init=False)

    @property
    def redis(self) -> redis.Redis:
        if self._redis is None:
            self._redis = redis.Redis(unix_socket_path=str(self.data_dir / "redis" / "redis.sock"))
        return self._redis

    def buffered_events(self) -> int:
        """Usage events still in the Redis buffer (not yet in the SQL store)."""
        keys = list(self.redis.scan_iter(match="sy:usage:*:buffer", count=1000))
        return sum(self.redis.xlen(key) for key in keys)

    def wait_exported(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while self.buffered_events() and time.monotonic() < deadline:
            time.sleep(0.1)


def start_served(
    rig: Rig,
    name: str,
    *,
    tree: Path | None = None,
    policy: Path,
    server: str = "uvicorn",
    extra: dict[str, str] | None = None,
) -> Served:
    """``switchyard serve`` with no Redis URL (its own embedded Redis, AOF on, as ``make run``)
    on the gateway's core, stopped with the rig; once it answers, a key with every limit the
    gateway has (rpm, tpm, a budget) that no load reaches. ``server``: a key of ``SERVERS``;
    ``extra``: environment on top of the bench's (a setting changed)."""
    url, process = start_gateway(
        rig.workdir, name, None, policy, extra or {}, tree=tree, server=SERVERS[server]
    )
    rig.processes.append(process)
    rig.gateways[url] = process
    try:
        wait_http(url + "/healthz", timeout=60)
    except RuntimeError:
        log = (rig.workdir / name / "gateway.log").read_text(errors="replace")
        sys.exit(f"the gateway {name} did not start; its log ends:\n{log[-2000:]}")
    served = Served(name, url, process.pid, rig.workdir / name)
    served.key = create_limited_key(url)
    return served


def create_limited_key(gateway: str) -> str:
    """A key with rpm, tpm and a monthly budget, none of which the load reaches."""
    import httpx

    reply = httpx.post(
        gateway + "/admin/keys",
        json={
            "name": "bench",
            "rpm": 10_000_000,
            "tpm": 10_000_000_000,
            "budget_usd": 1_000_000,
            "budget_period": "month",
        },
        headers=ADMIN_HEADERS,
    )
    reply.raise_for_status()
    return reply.json()["key"]


@dataclass(frozen=True)
class Measured:
    """One wrk run through a served gateway, with its Redis's share."""

    run: Run
    redis_cpu_us: float
    redis: RedisSample
    # SLOWLOG entries of the run (commands over SLOW_US): command -> (count, longest µs)
    slow: dict[str, tuple[int, int]] = field(default_factory=dict)


SLOW_US = 1000


def slow_commands(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """What the SLOWLOG holds, by command: how many, and the longest (µs)."""
    found: dict[str, tuple[int, int]] = {}
    for entry in client.slowlog_get(1024):
        name = entry["command"].split(b" ", 1)[0].decode().lower()
        count, longest = found.get(name, (0, 0))
        found[name] = (count + 1, max(longest, int(entry["duration"])))
    return found


def measure(served: Served | None, drive: Callable[[], Run]) -> Measured:
    """``drive`` (one load run) with the gateway's and its Redis's CPU per request, and the
    Redis commands that took longer than ``SLOW_US``."""
    if served is None:
        return Measured(drive(), math.nan, RedisSample(0, {}))
    served.wait_exported()
    served.redis.config_set("slowlog-log-slower-than", SLOW_US)
    served.redis.slowlog_reset()
    redis_before = RedisSample.of(served.redis)
    cpu_before = process_cpu_s(served.pid)
    run = drive()
    served.wait_exported()  # the export of the run's events is part of its cost
    cpu_s = process_cpu_s(served.pid) - cpu_before
    spent = RedisSample.of(served.redis).since(redis_before)
    slow = slow_commands(served.redis)
    if not run.requests:
        return Measured(run, math.nan, spent, slow)
    run = replace(run, cpu_us=cpu_s / run.requests * 1e6)
    return Measured(run, spent.cpu_s / run.requests * 1e6, spent, slow)


# -- streams -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamRun:
    streams_s: float
    ttfb_p50_ms: float
    streams: int
    cpu_us: float = math.nan
    redis_cpu_us: float = math.nan


async def _stream_load(url: str, key: str | None, clients: int, seconds: float) -> StreamRun:
    import aiohttp

    body = orjson.dumps({**BODY, "stream": True})
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    ttfb: list[float] = []
    failures = 0
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        deadline = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal failures
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as response:
                    first = True
                    async for _chunk in response.content.iter_any():
                        if first:
                            ttfb.append((time.perf_counter() - started) * 1000)
                            first = False
                    if response.status != 200:
                        failures += 1

        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - began
    if failures:
        print(f"  warning ({url}): {failures} streams failed", file=sys.stderr)
    return StreamRun(len(ttfb) / elapsed, statistics.median(ttfb), len(ttfb))


def stream_run(url: str, key: str | None, clients: int, seconds: float) -> StreamRun:
    return asyncio.run(_stream_load(url, key, clients, seconds))


def measure_streams(served: Served | None, url: str, clients: int, seconds: float) -> StreamRun:
    box: list[StreamRun] = []

    def drive() -> Run:
        box.append(stream_run(url, served.key if served else None, clients, seconds))
        return Run(box[0].streams_s, box[0].ttfb_p50_ms, math.nan, box[0].streams)

    measured = measure(served, drive)
    return replace(box[0], cpu_us=measured.run.cpu_us, redis_cpu_us=measured.redis_cpu_us)


# -- the bench -----------------------------------------------------------------------------


def load_average() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


def pin_load_core() -> None:
    """This process (the stream clients, wrk's parent) on the load's core."""
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, {LOAD_CORE})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell (median shown)")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--stream-clients", type=int, default=16)
    parser.add_argument(
        "--trees",
        nargs="+",
        type=Path,
        default=[],
        help="checkouts to compare (before first), each served by its own code, interleaved",
    )
    parser.add_argument(
        "--servers",
        default="uvicorn",
        help="comma list of uvicorn (switchyard serve), granian (pip install granian); "
        "the same app under each, interleaved",
    )
    args = parser.parse_args()
    for tree in args.trees:
        if not (tree / "gateway" / "__main__.py").is_file():
            parser.error(f"--trees: {tree} is not a checkout of the gateway")
    servers = parse_servers(parser, args.servers)
    if args.trees and servers != ["uvicorn"]:
        parser.error("--trees compares checkouts under uvicorn only; leave out --servers")
    levels = [int(c) for c in args.concurrency.split(",")]
    if args.stream_clients < 1:
        parser.error("--stream-clients must be >= 1 (the report has a streams row)")
    wrk = ensure_wrk()
    machine = cpu_model()  # before this process is pinned to one core
    pin_load_core()
    load_before = load_average()
    with bench_rig("switchyard-bench-run-", pinned=True) as rig:
        policy = rig.workdir / "plain_rules.yaml"
        policy.write_text(PLAIN_POLICY.format(base_url=rig.upstream))
        wait_http(rig.upstream + "/models")
        body = orjson.dumps(BODY).decode()
        direct_script = rig.workdir / "direct.lua"
        direct_script.write_text(WRK_SCRIPT.format(body=body, auth=""))
        # Each path: its name, the gateway serving it (None: the upstream straight), URL, script.
        paths: list[tuple[str, Served | None, str, Path]] = [
            ("direct", None, rig.upstream + "/chat/completions", direct_script)
        ]
        trees: list[Path | None] = [tree.resolve() for tree in args.trees] or [None]
        served_by = [(tree, server) for tree in trees for server in servers]
        for number, (tree, server) in enumerate(served_by):
            served = start_served(rig, f"served{number}", tree=tree, policy=policy, server=server)
            script = rig.workdir / f"served{number}.lua"
            auth = f'wrk.headers["Authorization"] = "Bearer {served.key}"'
            script.write_text(WRK_SCRIPT.format(body=body, auth=auth))
            url = served.url + "/v1/chat/completions"
            run_wrk(wrk, url, script, 16, 2)  # warm-up
            stream_run(url, served.key, args.stream_clients, 1)
            name = str(tree) if tree else server if len(servers) > 1 else "gateway"
            paths.append((name, served, url, script))
        results: dict[tuple[str, int], list[Measured]] = {}
        streams: dict[str, list[StreamRun]] = {}
        for round_number in range(1, args.repeat + 1):
            # The gateways swap places every round (the upstream straight stays first): a
            # slot's own bias (what ran just before it) falls on each of them alike.
            direct, *served_paths = paths
            if round_number % 2 == 0:
                served_paths.reverse()
            ordered = [direct, *served_paths]
            for level in levels:
                for name, by, url, script in ordered:
                    measured = measure(
                        by, lambda u=url, s=script, c=level: run_wrk(wrk, u, s, c, args.duration)
                    )
                    results.setdefault((name, level), []).append(measured)
                    if len(paths) > 2 and by is not None:
                        print(
                            f"round {round_number} c{level} {name}: {_line(measured)}", flush=True
                        )
            for name, by, url, _ in ordered:
                streams.setdefault(name, []).append(
                    measure_streams(by, url, args.stream_clients, args.duration)
                )
    names = [name for name, *_ in paths]
    report(args, levels, names, results, streams, machine, load_before)


def parse_servers(parser: argparse.ArgumentParser, listed: str) -> list[str]:
    """``--servers``: known names, each once; granian only where it is installed."""
    servers = [name.strip() for name in listed.split(",") if name.strip()]
    unknown = [name for name in servers if name not in SERVERS]
    if unknown or not servers or len(set(servers)) != len(servers):
        parser.error(f"--servers: a comma list of {', '.join(SERVERS)}, each once")
    if "granian" in servers and granian_version() is None:
        sys.exit(f"--servers granian: {GRANIAN_MISSING}")
    return servers


def servers_line(names: list[str]) -> str | None:
    """Which servers the rows are, when they are named by server."""
    if "granian" not in names:
        return None
    return (
        "servers: uvicorn = `switchyard serve` (uvloop, guarded httptools protocol); "
        f"granian {granian_version()} = bench/granian_serve.py (embedded, ASGI, HTTP/1.1, "
        "1 worker, uvloop, asyncio tasks, 1 Rust runtime thread)"
    )


def _line(measured: Measured) -> str:
    run = measured.run
    evalsha = measured.redis.commands.get("evalsha", (0, 0))
    return (
        f"{run.rps:,.0f} req/s, p50 {run.p50_ms:.3f} ms, gw {run.cpu_us:.0f} µs, "
        f"redis {measured.redis_cpu_us:.1f} µs CPU/request, "
        f"EVALSHA {evalsha[0] / max(run.requests, 1):.2f}/request "
        f"{evalsha[1] / max(evalsha[0], 1):.1f} µs/call"
    )


def report(
    args: argparse.Namespace,
    levels: list[int],
    names: list[str],
    results: dict[tuple[str, int], list[Measured]],
    streams: dict[str, list[StreamRun]],
    machine: str,
    load_before: str,
) -> None:
    def median(name: str, level: int, pick: Callable[[Measured], float]) -> float:
        return statistics.median(pick(m) for m in results[(name, level)])

    print(f"\nSwitchyard as `make run` serves it (median of {args.repeat} × {args.duration:g}s)")
    print(
        f"CPU: {machine}; gateway + embedded Redis + exporter on core {GATEWAY_CORE}; "
        f"upstream and load on core {LOAD_CORE}"
    )
    print(f"load average before: {load_before}; after: {load_average()}")
    if (line := servers_line(names)) is not None:
        print(line)
    header = (
        f"{'conc':>5} {'req/s':>9} {'+p50':>9} {'+p99':>9} {'gw cpu/req':>11} "
        f"{'redis cpu/req':>14} {'evalsha/req':>12} {'µs/evalsha':>11}  path"
    )
    print(header)
    print("-" * len(header))
    direct_ttfb = statistics.median(s.ttfb_p50_ms for s in streams["direct"])
    for level in levels:
        d50 = median("direct", level, lambda m: m.run.p50_ms)
        d99 = median("direct", level, lambda m: m.run.p99_ms)
        print(f"{level:>5} {median('direct', level, lambda m: m.run.rps):>9,.0f}  direct")
        for name in names[1:]:
            print(
                f"{level:>5} {median(name, level, lambda m: m.run.rps):>9,.0f} "
                f"{median(name, level, lambda m: m.run.p50_ms) - d50:>7.3f}ms "
                f"{median(name, level, lambda m: m.run.p99_ms) - d99:>7.3f}ms "
                f"{median(name, level, lambda m: m.run.cpu_us):>9.0f}us "
                f"{median(name, level, lambda m: m.redis_cpu_us):>12.1f}us "
                f"{median(name, level, _evalsha_per_request):>12.2f} "
                f"{median(name, level, _evalsha_usec):>9.1f}us  {name}"
            )
    for name in names:
        runs = streams[name]
        line = (
            f"stream c{args.stream_clients} {name}: "
            f"{statistics.median(s.streams_s for s in runs):,.0f} streams/s"
        )
        if name != "direct":
            ttfb = statistics.median(s.ttfb_p50_ms for s in runs) - direct_ttfb
            line += (
                f", +TTFB p50 {ttfb:.3f} ms, gw cpu/stream "
                f"{statistics.median(s.cpu_us for s in runs):.0f}us, redis cpu/stream "
                f"{statistics.median(s.redis_cpu_us for s in runs):.1f}us"
            )
        print(line)
    for name in names[2:]:
        for level in levels:
            print(
                paired_line(
                    level, names[1], name, results[(names[1], level)], results[(name, level)]
                )
            )
    for name in names[1:]:
        for level in levels:
            print_commands(f"c{level}, {name}", results[(name, level)])


@dataclass(frozen=True)
class Paired:
    """A tree against the first, round by round: on a box whose speed drifts by a tenth within
    a minute, the ratio of two runs next to each other moves less than either run."""

    rounds: int
    cpu_ratio: float  # median of the rounds' gateway + Redis CPU per request, after / before
    cpu_quartiles: tuple[float, float]
    rps_ratio: float  # median of the rounds' req/s, after / before
    cheaper_rounds: int  # rounds in which after cost less CPU per request


def paired(before: list[Measured], after: list[Measured]) -> Paired:
    """The ratios of the runs of each round (the i-th run of each list), before first."""
    cpu = [
        (a.run.cpu_us + a.redis_cpu_us) / (b.run.cpu_us + b.redis_cpu_us)
        for b, a in zip(before, after, strict=True)
    ]
    rps = [a.run.rps / b.run.rps for b, a in zip(before, after, strict=True)]
    quartiles = statistics.quantiles(cpu, n=4) if len(cpu) > 1 else [cpu[0]] * 3
    return Paired(
        rounds=len(cpu),
        cpu_ratio=statistics.median(cpu),
        cpu_quartiles=(quartiles[0], quartiles[2]),
        rps_ratio=statistics.median(rps),
        cheaper_rounds=sum(ratio < 1 for ratio in cpu),
    )


def paired_line(
    level: int, before_name: str, name: str, before: list[Measured], after: list[Measured]
) -> str:
    pair = paired(before, after)
    low, high = pair.cpu_quartiles
    return (
        f"c{level} {name} against {before_name}, round by round: gw + Redis CPU/request "
        f"{pair.cpu_ratio:.3f}x (quartiles {low:.3f}-{high:.3f}), cheaper in "
        f"{pair.cheaper_rounds} of {pair.rounds} rounds; req/s {pair.rps_ratio:.3f}x"
    )


def _evalsha_per_request(measured: Measured) -> float:
    calls = measured.redis.commands.get("evalsha", (0, 0))[0]
    return calls / measured.run.requests if measured.run.requests else math.nan


def _evalsha_usec(measured: Measured) -> float:
    calls, usec = measured.redis.commands.get("evalsha", (0, 0))
    return usec / calls if calls else math.nan


def print_commands(label: str, runs: list[Measured]) -> None:
    """Each Redis command's calls per request and µs per call, medians over the runs."""
    names = sorted({name for m in runs for name in m.redis.commands})
    rows = []
    for name in names:
        per_request, per_call = [], []
        for m in runs:
            calls, usec = m.redis.commands.get(name, (0, 0))
            if m.run.requests:
                per_request.append(calls / m.run.requests)
                per_call.append(usec / calls if calls else 0.0)
        calls_req = statistics.median(per_request)
        if calls_req >= 0.001:
            rows.append((name, calls_req, statistics.median(per_call)))
    print(f"\nRedis commands per request at {label} (calls/request, µs/call, µs/request):")
    for name, calls_req, usec_call in sorted(rows, key=lambda r: -r[1] * r[2]):
        print(f"  {name:>14} {calls_req:>8.3f} {usec_call:>8.2f} {calls_req * usec_call:>8.2f}")
    slow: dict[str, tuple[int, int]] = {}
    for m in runs:
        for name, (count, longest) in m.slow.items():
            total, most = slow.get(name, (0, 0))
            slow[name] = (total + count, max(most, longest))
    listed = ", ".join(
        f"{name} {count} (longest {longest / 1000:.1f} ms)"
        for name, (count, longest) in sorted(slow.items(), key=lambda item: -item[1][0])
    )
    print(f"  SLOWLOG over {SLOW_US / 1000:g} ms, {len(runs)} runs: {listed or 'none'}")


if __name__ == "__main__":
    main()
