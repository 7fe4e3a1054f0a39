"""Micro-benchmark of usage-store inserts: ``python -m bench.ledger`` (``make bench-ledger``).

It starts its own PostgreSQL (``ScratchPostgres``, fsync on) and times the whole insert of a
batch, rollups included, for each driver and loading method at several batch sizes:

* ``unnest``: one statement, the batch bound as one array per column;
* ``copy``: COPY into a temp staging table, then INSERT ... SELECT ... ON CONFLICT;
* ``executemany``: executemany into the staging table, then the same INSERT ... SELECT;
* ``values``: one multi-row ``VALUES`` list with a placeholder per field.

Drivers are asyncpg and psycopg 3 (async); a missing one is reported and skipped. One writer,
sequential batches, unique events of one day over 50 keys, 6 models, 0-2 tags and 500 users.
The runs of all configurations are interleaved ``--repeat`` times and the median is printed,
so load from other processes on the box spreads evenly. The SQLite store is timed too, with
``synchronous=FULL`` and ``NORMAL``. Figures go to stdout as a table, and as JSON with --json.

``--growth N`` times something else: each store as the gateway runs it (``SqliteStore``, and
``PostgresStore`` on the scratch server) while one day's table fills up to N events, once with
random event ids and once with time-ordered ones (``gateway/ledger/ids.py``), the two stores
taking batches in turn. It prints the median microseconds per event of the batches in each
eighth of the fill. ``--shared-buffers`` sizes PostgreSQL's cache, so that a day this box can
fill in a sitting outgrows it as a busy day outgrows a production server's.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import re
import secrets
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from scratch_postgres import ScratchPostgres

from bench.machine import cpu_model
from gateway.ledger.event import UsageEvent
from gateway.ledger.ids import time_ordered_id
from gateway.ledger.postgres_sql import (
    CREATE_STAGE,
    CREATE_VERSION_TABLE,
    EVENT_COLUMNS,
    INSERT_FROM_STAGE,
    INSERT_UNNEST,
    MIGRATIONS,
    STAGE_TABLE,
    create_partition_sql,
    event_row,
    insert_sql,
    unnest_columns,
    values_source,
)

METHODS = ("unnest", "copy", "executemany", "values")
DRIVERS = ("asyncpg", "psycopg")
TRUNCATE = "TRUNCATE usage_events, usage_rollup, usage_rollup_tag, usage_rollup_user"
_STAGE_INSERT_ARGS = ", ".join(f"${index}" for index in range(1, len(EVENT_COLUMNS) + 1))
STAGE_INSERT = f"INSERT INTO {STAGE_TABLE} VALUES ({_STAGE_INSERT_ARGS})"

InsertBatch = Callable[[list[UsageEvent]], Awaitable[int]]


def make_events(count: int, seed: int) -> list[UsageEvent]:
    """Unique events of the current day, in a realistic spread of keys and models."""
    rng = random.Random(seed)
    now_ms = int(time.time() * 1000)
    models = [("gpt-4o-mini", "openai"), ("gpt-4o", "openai"), ("claude-sonnet", "anthropic")]
    models += [("qwen3:0.6b", "local"), ("llama-3.1-8b", "fleet"), ("o3", "azure")]
    events = []
    for _ in range(count):
        model, provider = rng.choice(models)
        prompt = rng.randint(10, 4000)
        events.append(
            UsageEvent(
                event_id=uuid.UUID(int=rng.getrandbits(128)).hex,
                time_ms=now_ms - rng.randint(0, 1000),
                key_id=f"key{rng.randint(1, 50):04d}",
                model=model,
                provider=provider,
                team=rng.choice(["", "search", "support"]),
                task=rng.choice(["chat", "code", "summarize"]),
                route="default",
                prompt_tokens=prompt,
                completion_tokens=rng.randint(1, 1000),
                cached_tokens=rng.randint(0, prompt),
                cost_nanos=rng.randint(1, 50_000_000),
                status=rng.choice([200] * 19 + [502]),
                streamed=rng.random() < 0.5,
                latency_ms=rng.randint(50, 5000),
                ttft_ms=rng.randint(10, 500),
                policy_version="v1",
                end_user=f"user{rng.randint(1, 500)}",
                tags=tuple(rng.sample(["prod", "batch", "eval", "team:ml"], rng.randint(0, 2))),
            )
        )
    return events


def _sorted_rows(events: list[UsageEvent]) -> list[tuple[Any, ...]]:
    return sorted((event_row(event) for event in events), key=lambda row: (row[0], row[1]))


def _psycopg_sql(sql: str) -> str:
    return re.sub(r"\$\d+", "%s", sql)


async def asyncpg_method(
    url: str, method: str
) -> tuple[InsertBatch, Callable[[], Awaitable[None]]]:
    import asyncpg

    conn = await asyncpg.connect(url)
    await conn.execute(CREATE_STAGE)

    async def insert(events: list[UsageEvent]) -> int:
        rows = _sorted_rows(events)
        if method == "unnest":
            return await conn.fetchval(INSERT_UNNEST, *unnest_columns(rows))
        if method == "values":
            flat = [value for row in rows for value in row]
            return await conn.fetchval(insert_sql(values_source(len(rows))), *flat)
        async with conn.transaction():
            if method == "copy":
                await conn.copy_records_to_table(STAGE_TABLE, records=rows, columns=EVENT_COLUMNS)
            else:
                await conn.executemany(STAGE_INSERT, rows)
            return await conn.fetchval(INSERT_FROM_STAGE)

    return insert, conn.close


async def psycopg_method(
    url: str, method: str
) -> tuple[InsertBatch, Callable[[], Awaitable[None]]]:
    import psycopg

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await conn.execute(CREATE_STAGE)
    unnest_sql = _psycopg_sql(INSERT_UNNEST)
    stage_sql = _psycopg_sql(STAGE_INSERT)
    copy_sql = f"COPY {STAGE_TABLE} ({', '.join(EVENT_COLUMNS)}) FROM STDIN"

    async def insert(events: list[UsageEvent]) -> int:
        rows = _sorted_rows(events)
        async with conn.transaction(), conn.cursor() as cur:
            if method == "unnest":
                await cur.execute(unnest_sql, unnest_columns(rows), prepare=True)
            elif method == "values":
                flat = [value for row in rows for value in row]
                sql = _psycopg_sql(insert_sql(values_source(len(rows))))
                await cur.execute(sql, flat, prepare=True)
            else:
                if method == "copy":
                    async with cur.copy(copy_sql) as copy:
                        for row in rows:
                            await copy.write_row(row)
                else:
                    await cur.executemany(stage_sql, rows)
                await cur.execute(INSERT_FROM_STAGE, prepare=True)
            record = await cur.fetchone()
            return int(record[0]) if record else 0

    return insert, conn.close


async def prepare_database(url: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(CREATE_VERSION_TABLE)
        for migration in MIGRATIONS:
            await conn.execute(migration)
        today = time.gmtime()
        from datetime import date, timedelta

        day = date(today.tm_year, today.tm_mon, today.tm_mday)
        for offset in (-1, 0, 1):
            await conn.execute(create_partition_sql(day + timedelta(days=offset)))
    finally:
        await conn.close()


async def truncate(url: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(TRUNCATE)
        await conn.execute("VACUUM ANALYZE usage_events")
    finally:
        await conn.close()


async def time_inserts(
    insert: InsertBatch, events: list[UsageEvent], batch: int
) -> tuple[float, float]:
    """Events per second of inserting ``events`` in batches of ``batch``, one after another,
    and this process's CPU microseconds per event (the driver's share, less load-sensitive)."""
    started, cpu_started = time.perf_counter(), time.process_time()
    inserted = 0
    for start in range(0, len(events), batch):
        inserted += await insert(events[start : start + batch])
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    if inserted != len(events):
        raise RuntimeError(f"inserted {inserted} of {len(events)} events")
    return len(events) / elapsed, cpu * 1e6 / len(events)


def driver_available(driver: str) -> bool:
    try:
        __import__(driver)
    except ImportError:
        return False
    return True


class Results:
    """Events/s and client CPU us/event of every run, by configuration name."""

    def __init__(self) -> None:
        self.rates: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    def add(self, round_index: int, name: str, rate: float, cpu: float) -> None:
        self.rates.setdefault(name, []).append(rate)
        self.cpu.setdefault(name, []).append(cpu)
        print(
            f"  round {round_index + 1}: {name}: {rate:,.0f} events/s, cpu {cpu:.1f} us/event",
            flush=True,
        )

    def medians(self) -> dict[str, dict[str, float]]:
        return {
            name: {
                "events_per_s": statistics.median(rates),
                "min": min(rates),
                "max": max(rates),
                "client_cpu_us_per_event": statistics.median(self.cpu[name]),
            }
            for name, rates in self.rates.items()
        }


async def bench_postgres(
    results: Results,
    events_per_run: int,
    repeat: int,
    batches: list[int],
    drivers: list[str],
    methods: list[str],
) -> None:
    makers = {"asyncpg": asyncpg_method, "psycopg": psycopg_method}
    with ScratchPostgres(durable=True) as server:
        await prepare_database(server.url)
        for round_index in range(repeat):
            for driver in drivers:
                for method in methods:
                    for batch in batches:
                        await truncate(server.url)
                        events = make_events(events_per_run, seed=round_index)
                        insert, close = await makers[driver](server.url, method)
                        try:
                            rate, cpu = await time_inserts(insert, events, batch)
                        finally:
                            await close()
                        results.add(
                            round_index, f"postgres {driver} {method} batch={batch}", rate, cpu
                        )


async def bench_sqlite(
    results: Results, events_per_run: int, repeat: int, batches: list[int]
) -> None:
    from gateway.ledger.sqlite_store import SqliteStore

    for round_index in range(repeat):
        for synchronous in ("FULL", "NORMAL"):
            for batch in batches:
                with tempfile.TemporaryDirectory(prefix="sy-bench-sqlite-") as folder:
                    store = SqliteStore(Path(folder) / "usage.sqlite3", synchronous=synchronous)
                    await store.open()
                    try:
                        events = make_events(events_per_run, seed=round_index)
                        rate, cpu = await time_inserts(store.insert, events, batch)
                    finally:
                        await store.close()
                name = f"sqlite synchronous={synchronous} batch={batch}"
                results.add(round_index, name, rate, cpu)


ID_KINDS = {"random ids": lambda: secrets.token_hex(16), "time-ordered ids": time_ordered_id}


async def bench_growth(
    total: int, batch: int, *, sqlite: bool, postgres: bool, shared_buffers: str
) -> None:
    """Each store, filling one day's table with ``total`` events in batches of ``batch``, once
    per kind of event id; the two stores of a kind pair take batches in turn."""
    template = make_events(batch, seed=1)
    if sqlite:
        await _fill_sqlite(template, total, batch)
    if postgres:
        await _fill_postgres(template, total, batch, shared_buffers)


async def _fill_sqlite(template: list[UsageEvent], total: int, batch: int) -> None:
    from gateway.ledger.sqlite_store import SqliteStore

    with tempfile.TemporaryDirectory(prefix="sy-bench-growth-") as folder:
        stores = {
            kind: SqliteStore(Path(folder) / f"{n}.sqlite3") for n, kind in enumerate(ID_KINDS)
        }
        await _fill("sqlite", stores, template, total, batch)


async def _fill_postgres(
    template: list[UsageEvent], total: int, batch: int, shared_buffers: str
) -> None:
    import asyncpg

    from gateway.ledger.postgres_store import PostgresStore

    with ScratchPostgres(durable=True, shared_buffers=shared_buffers) as server:
        admin = await asyncpg.connect(server.url)
        try:
            for n in range(len(ID_KINDS)):
                await admin.execute(f"CREATE DATABASE growth{n}")
        finally:
            await admin.close()
        stores = {
            kind: PostgresStore(server.url_for(f"growth{n}")) for n, kind in enumerate(ID_KINDS)
        }
        await _fill("postgres", stores, template, total, batch)


async def _fill(
    name: str, stores: dict[str, Any], template: list[UsageEvent], total: int, batch: int
) -> None:
    for store in stores.values():
        await store.open()
    try:
        slices = max(1, min(8, total // batch))
        per_slice = max(1, total // batch // slices)
        times: dict[str, list[float]] = {kind: [] for kind in stores}
        print(
            f"{name}: us per event, median batch of each of {slices} parts ({batch} events a batch)"
        )
        print(f"  {'events':>9}  " + "  ".join(f"{kind:>16}" for kind in stores) + "   ratio")
        for index in range(per_slice * slices):
            for kind, store in stores.items():
                new_id, now_ms = ID_KINDS[kind], int(time.time() * 1000)
                # As the gateway records them: a new id, and the time of the request's end.
                events = [
                    dataclasses.replace(event, event_id=new_id(), time_ms=now_ms)
                    for event in template
                ]
                started = time.perf_counter()
                if await store.insert(events) != len(events):
                    raise RuntimeError(f"{name} {kind}: a batch was not inserted whole")
                times[kind].append((time.perf_counter() - started) * 1e6 / len(events))
            if (index + 1) % per_slice == 0:
                cells = [statistics.median(times[kind][-per_slice:]) for kind in stores]
                print(
                    f"  {(index + 1) * batch:>9,}  "
                    + "  ".join(f"{cell:>16.1f}" for cell in cells)
                    + f"   {cells[0] / cells[1]:5.2f}x",
                    flush=True,
                )
    finally:
        for store in stores.values():
            await store.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=10_000, help="events per timed run")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--batches", default="100,500,1000")
    parser.add_argument("--drivers", default=",".join(DRIVERS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the medians here")
    parser.add_argument(
        "--growth",
        type=int,
        metavar="N",
        help="instead: each store filling one day with N events, random against time-ordered ids",
    )
    parser.add_argument(
        "--shared-buffers",
        default="64MB",
        help="with --growth: the scratch PostgreSQL's shared_buffers (a day outgrowing them)",
    )
    args = parser.parse_args(argv)
    print(f"cpu: {cpu_model()}")
    if args.growth is not None:
        if args.growth < 1:
            parser.error("--growth: must be a positive number of events")
        batch = int(args.batches.split(",")[-1])
        growth = bench_growth(
            args.growth,
            batch,
            sqlite=not args.no_sqlite,
            postgres=not args.no_postgres,
            shared_buffers=args.shared_buffers,
        )
        asyncio.run(growth)
        return
    batches = [int(size) for size in args.batches.split(",")]
    drivers = []
    for driver in args.drivers.split(","):
        if driver_available(driver):
            drivers.append(driver)
        else:
            print(f"{driver}: not installed, skipped (pip install -e '.[dev]')")
    methods = args.methods.split(",")
    unknown = set(methods) - set(METHODS)
    if unknown:
        parser.error(f"unknown method {sorted(unknown)[0]!r}; choose from {', '.join(METHODS)}")
    load = os.getloadavg()
    print(f"cpus={os.cpu_count()} load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    results = Results()
    if not args.no_postgres:
        asyncio.run(bench_postgres(results, args.events, args.repeat, batches, drivers, methods))
    if not args.no_sqlite:
        asyncio.run(bench_sqlite(results, args.events, args.repeat, batches))
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"\nmedian of {args.repeat} runs, {args.events} events per run:")
    medians = results.medians()
    for name, row in medians.items():
        print(
            f"  {name:42s} {row['events_per_s']:>9,.0f} events/s"
            f"  (range {row['min']:,.0f}-{row['max']:,.0f})"
            f"  client cpu {row['client_cpu_us_per_event']:5.1f} us/event"
        )
    if args.json:
        args.json.write_bytes(orjson.dumps(medians, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
