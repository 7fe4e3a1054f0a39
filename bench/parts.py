"""``python -m bench.parts``: what the parts of a request cost, as ``make run`` serves it.

Gateways of this checkout, each with one part turned off, are served side by side as
``make bench-run`` serves them (``switchyard serve`` with its embedded Redis, on core 0; the
fake upstream and wrk on core 1), with a key that has every limit (rpm, tpm, a budget):

- **as served**: nothing off; its runs include exporting their usage events to SQLite;
- **key without limits**: a key with no rpm, tpm or budget, so no reservation (its usage
  event is still recorded, in the same settle batch);
- **no access log**: ``SWITCHYARD_ACCESS_LOG=false`` (the request metrics stay);
- **exporter held off**: ``SWITCHYARD_USAGE_EXPORT_INTERVAL_S=60``: the events stay in the
  Redis buffer during the runs (an export that falls inside a run is counted in it);
- **key without limits + one round trip** (``bench/limiter_floor.py``): that key, and one
  script call that only reads Redis's clock before each upstream call: the least any limiter
  costs that decides admissions in the store the replicas share, as docs/limits.md's
  exactness needs;
- **bare proxy** (``bench/bare_proxy.py``): Starlette and aiohttp alone under the same uvicorn,
  no Redis: the floor of a Python gateway on this core.

They take turns at each concurrency, in an order rotated every round, after a run straight at
the upstream. Per concurrency it prints req/s, p50 and what that adds to the upstream's own,
the gateway's CPU per request (``/proc``), its Redis's (``INFO``), the two together, and how
much less than as served each costs: the share of the part turned off.
Then the same for streams (``--stream-clients``, default 16; 0 for none), as ``bench.run``
drives them: streams/s, the time to the first body byte (p50) and what it adds to the
upstream's own (streamed straight from it in the same round), and the CPU per stream. Each
cell is the median of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson

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
from bench.machine import cpu_model
from bench.run import (
    ADMIN_HEADERS,
    RedisSample,
    Served,
    load_average,
    pin_load_core,
    start_served,
    stream_run,
)

_ROOT = Path(__file__).resolve().parent.parent
# Where Python finds bench/limiter_floor_site/sitecustomize.py, and the bench package it loads.
FLOOR_PATH = os.pathsep.join([str(_ROOT / "bench" / "limiter_floor_site"), str(_ROOT)])


@dataclass(frozen=True)
class Part:
    """A gateway with one part off or added (``env``), or the bare proxy (``bare``)."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    exported: bool = True  # wait for the run's events to reach SQLite, and count that work
    bare: bool = False
    limited: bool = True  # the key has every limit (rpm, tpm, a budget), or none


PARTS = (
    Part("as served"),
    Part("key without limits", limited=False),
    Part("no access log", {"SWITCHYARD_ACCESS_LOG": "false"}),
    Part("exporter held off", {"SWITCHYARD_USAGE_EXPORT_INTERVAL_S": "60"}, exported=False),
    Part("key without limits + one round trip", {"PYTHONPATH": FLOOR_PATH}, limited=False),
    Part("bare proxy", exported=False, bare=True),
)


STREAMS = 0  # the costs' level for the stream runs
DIRECT = "upstream straight"


@dataclass(frozen=True)
class Cost:
    run: Run
    gateway_us: float
    redis_us: float

    @property
    def total_us(self) -> float:
        return self.gateway_us + (0.0 if math.isnan(self.redis_us) else self.redis_us)


def measure(part: Part, served: Served, drive: Callable[[], Run]) -> Cost:
    """One run with the CPU per request of the process and of its Redis (none: bare)."""
    if part.exported:
        served.wait_exported()
    redis_before = None if part.bare else RedisSample.of(served.redis)
    cpu_before = process_cpu_s(served.pid)
    run = drive()
    if part.exported:
        served.wait_exported()
    cpu_s = process_cpu_s(served.pid) - cpu_before
    requests = max(run.requests, 1)
    redis_us = math.nan
    if redis_before is not None:
        redis_us = RedisSample.of(served.redis).since(redis_before).cpu_s / requests * 1e6
    return Cost(run, cpu_s / requests * 1e6, redis_us)


def streams(url: str, key: str | None, clients: int, seconds: float) -> Run:
    """``clients`` streams at a time for ``seconds``, as a ``Run``: streams/s, the time to
    the first body byte (p50) in ``p50_ms``, and how many streams."""
    done = stream_run(url, key, clients, seconds)
    return Run(done.streams_s, done.ttfb_p50_ms, math.nan, done.streams)


def create_unlimited_key(gateway: str) -> str:
    """A key with no limits at all: the gateway reserves nothing for its requests."""
    reply = httpx.post(gateway + "/admin/keys", json={"name": "bench"}, headers=ADMIN_HEADERS)
    reply.raise_for_status()
    return reply.json()["key"]


def start_bare(rig: Rig, policy: Path) -> Served:
    """The bare proxy on the gateway's core, stopped with the rig."""
    extra = {"BENCH_BARE_UPSTREAM": rig.upstream}
    url, process = start_gateway(
        rig.workdir, "bare", None, policy, extra, server=("-m", "bench.bare_proxy")
    )
    rig.processes.append(process)
    wait_http(url + "/healthz", timeout=60)
    return Served("bare", url, process.pid, rig.workdir / "bare")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell (median shown)")
    parser.add_argument("--concurrency", default="1,64", help="comma-separated, e.g. 1,64")
    parser.add_argument(
        "--stream-clients", type=int, default=16, help="streams at a time (0: no stream rows)"
    )
    args = parser.parse_args(argv)
    try:
        levels = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        parser.error(f"--concurrency: a comma list of integers, not {args.concurrency!r}")
    if not levels or min(levels) < 1 or args.repeat < 1 or args.duration <= 0:
        parser.error("--concurrency levels and --repeat must be >= 1, --duration > 0")
    if args.stream_clients < 0:
        parser.error("--stream-clients must be >= 0")
    wrk = ensure_wrk()
    machine = cpu_model()  # before this process is pinned to one core
    pin_load_core()
    load_before = load_average()
    with bench_rig("switchyard-bench-parts-", pinned=True) as rig:
        policy = rig.workdir / "plain_rules.yaml"
        policy.write_text(PLAIN_POLICY.format(base_url=rig.upstream))
        wait_http(rig.upstream + "/models")
        body = orjson.dumps(BODY).decode()
        targets: list[tuple[Part, Served, str, Path]] = []
        for number, part in enumerate(PARTS):
            if part.bare:
                served, auth = start_bare(rig, policy), ""
            else:
                served = start_served(rig, f"part{number}", policy=policy, extra=part.env)
                if not part.limited:
                    served.key = create_unlimited_key(served.url)
                auth = f'wrk.headers["Authorization"] = "Bearer {served.key}"'
            script = rig.workdir / f"part{number}.lua"
            script.write_text(WRK_SCRIPT.format(body=body, auth=auth))
            url = served.url + "/v1/chat/completions"
            run_wrk(wrk, url, script, 16, 2)  # warm-up
            targets.append((part, served, url, script))
        direct_script = rig.workdir / "direct.lua"
        direct_script.write_text(WRK_SCRIPT.format(body=body, auth=""))
        direct_url = rig.upstream + "/chat/completions"
        costs: dict[tuple[str, int], list[Cost]] = {}
        for round_number in range(args.repeat):
            shift = round_number % len(targets)
            for level in levels:
                direct = run_wrk(wrk, direct_url, direct_script, level, args.duration)
                costs.setdefault((DIRECT, level), []).append(Cost(direct, math.nan, math.nan))
                for part, served, url, script in targets[shift:] + targets[:shift]:
                    cost = measure(
                        part,
                        served,
                        lambda u=url, s=script, c=level: run_wrk(wrk, u, s, c, args.duration),
                    )
                    costs.setdefault((part.name, level), []).append(cost)
            if args.stream_clients:
                clients, seconds = args.stream_clients, args.duration
                direct = streams(direct_url, None, clients, seconds)
                costs.setdefault((DIRECT, STREAMS), []).append(Cost(direct, math.nan, math.nan))
                for part, served, url, _script in targets[shift:] + targets[:shift]:
                    key = None if part.bare else served.key
                    cost = measure(
                        part, served, lambda u=url, k=key, c=clients, s=seconds: streams(u, k, c, s)
                    )
                    costs.setdefault((part.name, STREAMS), []).append(cost)
    report(args, levels, costs, machine, load_before)
    return 0


def report(
    args: argparse.Namespace,
    levels: list[int],
    costs: dict[tuple[str, int], list[Cost]],
    machine: str,
    load_before: str,
) -> None:
    print(f"\nWhat the parts of a request cost (median of {args.repeat} × {args.duration:g}s)")
    print(
        f"CPU: {machine}; each gateway + its embedded Redis + exporter on core {GATEWAY_CORE}; "
        f"upstream and wrk on core {LOAD_CORE}"
    )
    print(f"load average before: {load_before}; after: {load_average()}")
    print(
        f"{'conc':>5} {'req/s':>8} {'p50 ms':>8} {'+p50 ms':>8} {'gw µs/req':>10} "
        f"{'redis µs/req':>13} {'total µs/req':>13} {'less than served':>17}  gateway"
    )
    for level in levels:
        direct = costs[(DIRECT, level)]
        direct_p50 = statistics.median(c.run.p50_ms for c in direct)
        print(
            f"{level:>5} {statistics.median(c.run.rps for c in direct):>8,.0f} "
            f"{direct_p50:>8.3f} {'':>8} {'':>10} {'':>13} {'':>13} {'':>17}  {DIRECT}"
        )
        for part in PARTS:
            done = costs[(part.name, level)]
            p50 = statistics.median(c.run.p50_ms for c in done)
            print(
                f"{level:>5} {statistics.median(c.run.rps for c in done):>8,.0f} "
                f"{p50:>8.3f} {p50 - direct_p50:>8.3f} {cost_cells(part, costs, level)}"
            )
    if (DIRECT, STREAMS) in costs:
        report_streams(args.stream_clients, costs)


def report_streams(clients: int, costs: dict[tuple[str, int], list[Cost]]) -> None:
    """The stream rows: each part's streams against the upstream streamed straight."""
    direct = costs[(DIRECT, STREAMS)]
    direct_ttfb = statistics.median(c.run.p50_ms for c in direct)
    print(
        f"\nStreams, {clients} at a time; the upstream straight: "
        f"{statistics.median(c.run.rps for c in direct):,.0f} streams/s, "
        f"first byte p50 {direct_ttfb:.3f} ms"
    )
    print(
        f"{'streams/s':>9} {'TTFB ms':>8} {'+TTFB ms':>9} {'gw µs/str':>10} "
        f"{'redis µs/str':>13} {'total µs/str':>13} {'less than served':>17}  gateway"
    )
    for part in PARTS:
        done = costs[(part.name, STREAMS)]
        ttfb = statistics.median(c.run.p50_ms for c in done)
        print(
            f"{statistics.median(c.run.rps for c in done):>9,.0f} {ttfb:>8.3f} "
            f"{ttfb - direct_ttfb:>9.3f} {cost_cells(part, costs, STREAMS)}"
        )


def cost_cells(part: Part, costs: dict[tuple[str, int], list[Cost]], level: int) -> str:
    """A row's CPU columns (gateway, Redis, both, less than as served) and the part's name."""
    done = costs[(part.name, level)]
    total = statistics.median(c.total_us for c in done)
    redis_us = statistics.median(c.redis_us for c in done)
    served_total = statistics.median(c.total_us for c in costs[(PARTS[0].name, level)])
    saved = "" if part is PARTS[0] else f"{served_total - total:,.0f} µs"
    return (
        f"{statistics.median(c.gateway_us for c in done):>10,.0f} "
        f"{'-' if math.isnan(redis_us) else f'{redis_us:,.1f}':>13} "
        f"{total:>13,.0f} {saved:>17}  {part.name}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
