"""``make bench-usage``: what usage costs Redis per request, and how fast the exporter empties it.

``memory`` (a memory figure, not a speed one): a gateway process (auth, limits and usage on)
in front of the loopback fake upstream, on a Redis of its own; Redis ``used_memory`` and key
count after a warm-up and again after ``--requests`` requests (wrk, c64) once the exporter has
caught up (``pending_export`` 0), and the usage store's growth on disk per request.

``export``: the Redis buffer filled with ``--events`` usage events, then ``--exporters``
exporters empty it into a usage store (a scratch PostgreSQL with fsync on, and SQLite), timed
from the first read to the last acknowledgement; events/s, the median of ``--repeat`` rounds
(each on a fresh store), with the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import structlog
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from scratch_postgres import ScratchPostgres

from bench.gateway import (
    ADMIN_KEY,
    BODY,
    bench_rig,
    create_bench_key,
    ensure_wrk,
    wait_http,
)
from bench.ledger import make_events
from gateway.ledger import UsageEvent, UsageStore, open_store
from gateway.metering.buffer import UsageBuffer
from gateway.metering.exporter import UsageExporter
from gateway.metrics import Metrics
from gateway.settings import ExportSettings
from gateway.store.embedded import EmbeddedRedis
from gateway.store.scripts import ScriptBatch

COUNTING_SCRIPT = """
wrk.method = "POST"
wrk.body = [[{body}]]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {key}"
local answered = 0
response = function(status, headers, body)
  answered = answered + 1
  if answered >= {count} then
    wrk.thread:stop()
  end
end
"""


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


# -- memory ------------------------------------------------------------------------------------


def _wait_exported(gateway: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    while time.monotonic() < deadline:
        body = httpx.get(
            gateway + "/admin/usage/events", params={"limit": 1}, headers=headers, timeout=10
        ).json()
        if body["pending_export"] == 0:
            return
        time.sleep(0.2)
    raise RuntimeError("the exporter did not catch up")


def _requests_served(gateway: str) -> int:
    total = 0.0
    for family in text_string_to_metric_families(httpx.get(gateway + "/metrics").text):
        for sample in family.samples:
            if sample.name == "switchyard_requests_total":
                total += sample.value
    return int(total)


@dataclass(frozen=True)
class RedisFigures:
    used_memory: int
    keys: int
    dataset: int  # used_memory less Redis's own overhead (clients, scripts, startup)
    clients: int  # bytes of the normal clients' buffers
    connected: int


def _redis_figures(url: str) -> RedisFigures:
    """Measured once idle: Redis shrinks idle clients' query buffers in its cron (about 2 s),
    which would otherwise count the load's transient buffers as stored state."""
    time.sleep(3)
    client = SyncRedis.from_url(url)
    try:
        stats = client.memory_stats()
        return RedisFigures(
            used_memory=int(client.info("memory")["used_memory"]),
            keys=int(client.dbsize()),
            dataset=int(stats["dataset.bytes"]),
            clients=int(stats["clients.normal"]),
            connected=int(client.info("clients")["connected_clients"]),
        )
    finally:
        client.close()


def _sqlite_bytes(path: Path) -> int:
    """The store file's size once its WAL is checkpointed into it."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path.stat().st_size


def memory(args: argparse.Namespace) -> None:
    wrk = ensure_wrk()
    with bench_rig("switchyard-bench-usage-", pinned=False) as rig:
        gateway = rig.start_gateway("gw", {"SWITCHYARD_ACCESS_LOG": "false"})
        wait_http(gateway + "/healthz")
        key = create_bench_key(gateway)
        script = rig.workdir / "count.lua"

        def run(count: int) -> None:
            """``count`` more answered requests. wrk's thread stops sending at ``count`` answers,
            but wrk itself only exits at ``-d`` or SIGINT: send that once the gateway counts
            them (in flight at the stop: up to c-1 more, counted by ``_requests_served``)."""
            target = _requests_served(gateway) + count
            script.write_text(
                COUNTING_SCRIPT.format(body=orjson.dumps(BODY).decode(), key=key, count=count)
            )
            command = [wrk, "-t1", f"-c{args.concurrency}", "-d3600s", "-s", str(script)]
            load = subprocess.Popen([*command, gateway + "/v1/chat/completions"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
            try:
                while _requests_served(gateway) < target:
                    if load.poll() is not None:
                        raise RuntimeError(f"wrk exited early: {load.stderr.read().decode()}")
                    time.sleep(0.25)
            finally:
                load.send_signal(signal.SIGINT)
                load.wait(10)

        run(args.warmup)  # pools, limiter windows, the key's records, the buffer's streams
        _wait_exported(gateway)
        served_before = _requests_served(gateway)
        before = _redis_figures(rig.redis.url)
        store_file = rig.workdir / "gw" / "usage" / "usage.sqlite3"
        store_before = _sqlite_bytes(store_file)
        started = time.monotonic()
        print(f"load average before: {load_average()}")
        run(args.requests)
        elapsed = time.monotonic() - started
        _wait_exported(gateway)
        caught_up = time.monotonic() - started
        served = _requests_served(gateway) - served_before
        after = _redis_figures(rig.redis.url)
        store_after = _sqlite_bytes(store_file)
        print(f"load average after: {load_average()}")

    grown, added = after.used_memory - before.used_memory, after.keys - before.keys
    print(
        f"\n{served:,} requests (wrk c{args.concurrency}) in {elapsed:.1f} s; export caught up "
        f"{caught_up - elapsed:.1f} s after the last answer"
    )
    print(
        f"Redis used_memory: {before.used_memory:,} -> {after.used_memory:,} bytes: {grown:+,} = "
        f"{grown / served:.2f} bytes per request (target < 50)"
    )
    print(
        f"  of which dataset {after.dataset - before.dataset:+,} bytes, client buffers "
        f"{after.clients - before.clients:+,} bytes ({before.connected} -> {after.connected} "
        "connections)"
    )
    print(
        f"Redis keys: {before.keys:,} -> {after.keys:,}: {added:+,} = "
        f"{added / served:.4f} keys per request (target < 0.01)"
    )
    print(
        f"usage store (SQLite, checkpointed): {store_before:,} -> {store_after:,} bytes = "
        f"{(store_after - store_before) / served:.0f} bytes per request"
    )


# -- export ------------------------------------------------------------------------------------


def make_usage_events(count: int, seed: int) -> list[UsageEvent]:
    """The ledger benchmark's events (``bench.ledger.make_events``: unique, of the
    current day, over 50 keys, 6 models, 3 teams and 3 tasks) as the gateway records them;
    without end users and tags, so that the export figures stay comparable with earlier ones."""
    return [dataclasses.replace(event, end_user="", tags=()) for event in make_events(count, seed)]


async def fill(buffer: UsageBuffer, events: list[UsageEvent]) -> None:
    for start in range(0, len(events), 1000):
        batch = ScriptBatch()
        for event in events[start : start + 1000]:
            buffer.queue_append(batch, event.event_id, event.to_json())
        await batch.execute(buffer.redis)


async def export_round(
    redis_url: str, store: UsageStore, events: list[UsageEvent], batch: int, exporters: int
) -> tuple[float, float]:
    """Events/s and the client's CPU µs per event of emptying a filled buffer."""
    client = Redis.from_url(redis_url)
    try:
        await client.flushall()
        buffer = UsageBuffer(client)
        buffer.bind(store.store_id)
        await buffer.ensure_groups()
        await fill(buffer, events)
        log = structlog.get_logger()
        workers = [
            UsageExporter(buffer, store, ExportSettings(batch=batch), Metrics(), log,
                          consumer=f"bench-{index}")
            for index in range(exporters)
        ]  # fmt: skip
        cpu, started = time.process_time(), time.perf_counter()
        moved = sum(await asyncio.gather(*(worker.drain() for worker in workers)))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        stats = await buffer.stats()
        assert moved == len(events) and stats.backlog == 0, (moved, stats)
        return len(events) / elapsed, cpu / len(events) * 1e6
    finally:
        await client.aclose()


async def export_bench(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="switchyard-bench-export-"))
    redis_server = EmbeddedRedis(workdir / "redis", port=free_port(), appendonly=False)
    postgres = ScratchPostgres(durable=True) if "postgresql" in args.stores else None
    results: dict[str, list[tuple[float, float]]] = {}
    try:
        redis_server.start()
        if postgres is not None:
            postgres.start()
        print(f"cpus={os.cpu_count()} load average before: {load_average()}")
        for round_index in range(args.repeat):
            events = make_usage_events(args.events, seed=round_index)
            for kind in args.stores:
                store = await _fresh_store(kind, workdir, postgres, round_index)
                try:
                    rate = await export_round(
                        redis_server.url, store, events, args.batch, args.exporters
                    )
                finally:
                    await store.close()
                results.setdefault(kind, []).append(rate)
        print(f"load average after: {load_average()}")
    finally:
        redis_server.stop()
        if postgres is not None:
            postgres.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"\nexporter throughput, {args.events:,} events per round, batch {args.batch}, "
        f"{args.exporters} exporter(s), median of {args.repeat} rounds:"
    )
    for kind, rounds in results.items():
        rates = [rate for rate, _ in rounds]
        cpu = statistics.median(cpu for _, cpu in rounds)
        print(
            f"  {kind:10s} {statistics.median(rates):>9,.0f} events/s "
            f"(range {min(rates):,.0f}-{max(rates):,.0f}), client cpu {cpu:.1f} us/event"
        )


async def _fresh_store(
    kind: str, workdir: Path, postgres: ScratchPostgres | None, round_index: int
) -> UsageStore:
    if kind == "sqlite":
        return await open_store("", data_dir=workdir / f"sqlite-{round_index}")
    assert postgres is not None
    import asyncpg

    name = f"bench_export_{round_index}"
    admin = await asyncpg.connect(postgres.url)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    return await open_store(postgres.url_for(name), data_dir=workdir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode")
    mem = modes.add_parser("memory", help="Redis bytes and keys per request, export caught up")
    mem.add_argument("--requests", type=int, default=100_000)
    mem.add_argument("--warmup", type=int, default=2_000)
    mem.add_argument("--concurrency", type=int, default=64)
    exp = modes.add_parser("export", help="exporter events/s into PostgreSQL and SQLite")
    exp.add_argument("--events", type=int, default=50_000)
    exp.add_argument("--batch", type=int, default=1000)
    exp.add_argument("--exporters", type=int, default=1)
    exp.add_argument("--repeat", type=int, default=3)
    exp.add_argument("--stores", default="postgresql,sqlite")
    args = parser.parse_args(argv)
    # The stores' own info lines (migrations) would interleave with the figures.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.mode == "memory":
        memory(args)
    elif args.mode == "export":
        args.stores = [kind.strip() for kind in args.stores.split(",")]
        unknown = set(args.stores) - {"postgresql", "sqlite"}
        if unknown:
            parser.error(f"unknown store {sorted(unknown)[0]!r}: postgresql or sqlite")
        asyncio.run(export_bench(args))
    else:
        parser.print_help()


if __name__ == "__main__":
    main()
