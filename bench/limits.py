"""The limiter's Redis cost alone: reserve, then settle, against an embedded Redis as ``make run``
starts it (AOF on), without a gateway in the way.

Concurrent workers (``--concurrency``, default 1 and 64) each reserve for one key (rpm, tpm and
a monthly budget, as ``make bench-run``'s key), wait 0.5 ms (the upstream), and hand the
reservation to a settle batch of the kind the gateway runs (every settle of one event-loop turn
in one round trip). ``--team``: the key belongs to a team with rpm, tpm, a day and a month
budget and an in-flight cap, checked in the same script. The key's windows (and the team's)
start a minute deep (60 busy sub-buckets). Printed per tree and concurrency: Redis CPU per
request (``INFO cpu``, user + system), script calls per request and their µs per call
(``INFO commandstats``), the medians of ``--repeat`` runs.

``--trees BEFORE AFTER`` runs each checkout's own limiter (this file run with that checkout
first on the path), interleaved, so a busy box drifts on all of them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

SETTLE_TOKENS, SETTLE_NANOS = 50, 500


async def _run(requests: int, concurrency: int, team: bool) -> dict[str, float]:
    import redis
    import redis.asyncio

    from gateway.metering.limits import KeyLimits, Limiter
    from gateway.store.direct import DirectRedis
    from gateway.store.embedded import EmbeddedRedis
    from gateway.store.scripts import ScriptBatch

    server = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="bench-limits-")) / "redis")
    server.start()
    sync = redis.Redis(unix_socket_path=str(server.socket_path))
    client = redis.asyncio.Redis(unix_socket_path=str(server.socket_path), max_connections=512)
    limiter = Limiter(client)
    direct = DirectRedis(client)
    limits = KeyLimits(rpm=10_000_000, tpm=10_000_000_000, budget_nanos=10**15)
    home = None
    if team:
        home = "team:bench"
        sync.hset(
            "sy:{team:bench}",
            mapping={
                "rpm": 10_000_000,
                "tpm": 10_000_000_000,
                "max_parallel_requests": 100_000,
                "budget_day_nanos": 10**15,
                "budget_month_nanos": 10**15,
            },
        )
    windows = [limiter.keys("bench", home)[:2]]
    if team:
        windows.append(limiter.team_keys("bench")[:2])
    now = int(time.time())
    for rpm, tpm in windows:
        for bucket in range(now - 58, now + 1):  # a busy minute behind
            sync.hset(rpm, str(bucket), 5)
            sync.hset(tpm, str(bucket), 500)
    pending: list[tuple[Any, asyncio.Future[None]]] = []
    flushes: set[asyncio.Future[None]] = set()

    async def flush() -> None:
        await asyncio.sleep(0)
        batch, pending[:] = list(pending), []
        commands = ScriptBatch()
        if hasattr(limiter, "queue_settles"):
            limiter.queue_settles(
                commands, [(held, SETTLE_TOKENS, SETTLE_NANOS) for held, _ in batch]
            )
        else:  # a tree from before settles were grouped
            for held, _ in batch:
                limiter.queue_settle(commands, held, tokens=SETTLE_TOKENS, cost_nanos=SETTLE_NANOS)
        await commands.execute(direct)
        for _, done in batch:
            done.set_result(None)

    async def worker(count: int) -> None:
        for _ in range(count):
            held = await limiter.reserve(
                "bench",
                limits,
                tokens=100,
                cost_nanos=1000,
                request_id=uuid.uuid4().hex,
                home=home,
            )
            done = asyncio.get_running_loop().create_future()
            if not pending:
                flushing = asyncio.ensure_future(flush())
                flushes.add(flushing)
                flushing.add_done_callback(flushes.discard)
            pending.append((held, done))
            await done
            await asyncio.sleep(0.0005)

    try:
        await asyncio.gather(*(worker(3) for _ in range(concurrency)))  # warm-up
        cpu0, stats0 = sync.info("cpu"), sync.info("commandstats")
        started = time.perf_counter()
        await asyncio.gather(*(worker(requests // concurrency) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        cpu1, stats1 = sync.info("cpu"), sync.info("commandstats")
    finally:
        await client.aclose()
        server.stop()
    done_requests = requests // concurrency * concurrency
    cpu = sum(float(cpu1[f]) - float(cpu0[f]) for f in ("used_cpu_user", "used_cpu_sys"))
    calls = stats1["cmdstat_evalsha"]["calls"] - stats0["cmdstat_evalsha"]["calls"]
    usec = stats1["cmdstat_evalsha"]["usec"] - stats0["cmdstat_evalsha"]["usec"]
    return {
        "redis_us": cpu / done_requests * 1e6,
        "scripts": calls / done_requests,
        "us_per_script": usec / calls,
        "rps": done_requests / elapsed,
    }


def _child(requests: int, concurrency: int, team: bool) -> dict[str, float]:
    """This file run again with ``tree`` first on the path: that checkout's limiter. ``-P``:
    not this file's folder first, where ``bench/gateway.py`` would hide the ``gateway`` package."""
    return json.loads(
        subprocess.run(
            [
                sys.executable,
                "-P",
                __file__,
                "--child",
                str(requests),
                str(concurrency),
                str(int(team)),
            ],
            env={**os.environ, "PYTHONPATH": os.environ["BENCH_LIMITS_TREE"]},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        requests, concurrency, team = (int(a) for a in sys.argv[2:5])
        print(json.dumps(asyncio.run(_run(requests, concurrency, bool(team)))))
        return
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--requests", type=int, default=4000, help="per run (a quarter of it at c1)"
    )
    parser.add_argument("--concurrency", default="1,64", help="comma list of workers")
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell (median shown)")
    parser.add_argument(
        "--trees",
        nargs="+",
        type=Path,
        default=[Path(".")],
        help="checkouts to compare (before first), each with its own limiter, interleaved",
    )
    parser.add_argument("--team", action="store_true", help="a key of a team with every limit")
    args = parser.parse_args()
    from bench.machine import cpu_model

    levels = [int(c) for c in args.concurrency.split(",")]
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    load_before = os.getloadavg()
    for _ in range(args.repeat):
        for level in levels:
            for tree in args.trees:
                os.environ["BENCH_LIMITS_TREE"] = str(tree.resolve())
                requests = args.requests if level > 1 else args.requests // 4
                results.setdefault((str(tree), level), []).append(
                    _child(requests, level, args.team)
                )
    whose = "a key of a team" if args.team else "a key of no team"
    print(f"\nThe limiter alone: reserve + settle, {whose} (median of {args.repeat} runs)")
    print(
        f"CPU: {cpu_model()}; load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    for level in levels:
        for tree in args.trees:
            runs = results[(str(tree), level)]

            def median(name: str, runs: list[dict[str, float]] = runs) -> float:
                return statistics.median(run[name] for run in runs)

            print(
                f"c{level:<3} {median('redis_us'):7.1f} µs Redis CPU/request, "
                f"{median('scripts'):.2f} scripts/request at {median('us_per_script'):6.1f} µs "
                f"each, {median('rps'):7,.0f} req/s  {tree}"
            )


if __name__ == "__main__":
    main()
