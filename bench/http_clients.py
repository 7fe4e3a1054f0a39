"""``python -m bench.http_clients``: the CPU an upstream call costs, by HTTP client.

The gateway's upstream calls go through aiohttp (``gateway/providers/http_upstream.py``). This
measures what one JSON call costs the calling process with the gateway's own ``HttpUpstream``
and with the other asyncio HTTP clients installed (pyreqwest, rnet, httpx; each is skipped with
a line saying so when it is not installed), as ``make bench-run`` places the gateway: the
caller alone on core 0 (uvloop, as served), the bench's fake upstream on core 1. Each client
runs in a process of its own, ``--concurrency`` loops of POSTs with the bench's chat body, the
answer read and parsed; CPU is the process's user + system time (every thread: a client that
runs its I/O on a runtime thread of its own pays for it here). The clients take turns within
each repeat, in an order rotated each time, and each cell is the median of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import fake_upstream
import orjson
from ports import free_port

from bench.gateway import BODY, GATEWAY_CORE, LOAD_CORE, taskset_prefix, wait_http
from bench.machine import cpu_model

CLIENTS = ("gateway", "aiohttp", "pyreqwest", "rnet", "httpx")
# The module each client needs: a client whose module is missing is reported, not run.
MODULES = {"gateway": "aiohttp", "aiohttp": "aiohttp", "pyreqwest": "pyreqwest",
           "rnet": "rnet", "httpx": "httpx"}  # fmt: skip
HEADERS = {"authorization": "Bearer bench-upstream-key", "content-type": "application/json"}
WARMUP_CALLS = 50
REPO = Path(__file__).resolve().parents[1]

Call = Callable[[], Awaitable[None]]


def _parsed(raw: bytes) -> None:
    if not isinstance(orjson.loads(raw), dict):
        raise RuntimeError("the upstream's answer is not a JSON object")


async def _gateway_call(url: str, body: bytes) -> tuple[Call, Callable[[], Awaitable[None]]]:
    from gateway.providers.http_upstream import HttpUpstream
    from gateway.settings import UpstreamSettings

    upstream = HttpUpstream("bench", UpstreamSettings())

    async def call() -> None:
        await upstream.post_json(url, body, HEADERS)  # parses the answer itself

    return call, upstream.close


async def _aiohttp_call(url: str, body: bytes) -> tuple[Call, Callable[[], Awaitable[None]]]:
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def call() -> None:
        async with session.post(url, data=body, headers=HEADERS) as response:
            raw = await response.read()
            if response.status != 200:
                raise RuntimeError(f"status {response.status}")
            _parsed(raw)

    return call, session.close


async def _pyreqwest_call(url: str, body: bytes) -> tuple[Call, Callable[[], Awaitable[None]]]:
    from pyreqwest.client import ClientBuilder

    client = await ClientBuilder().build().__aenter__()

    async def call() -> None:
        response = await client.post(url).headers(HEADERS).body_bytes(body).build().send()
        raw = bytes(await response.bytes())
        if response.status != 200:
            raise RuntimeError(f"status {response.status}")
        _parsed(raw)

    return call, client.close


async def _rnet_call(url: str, body: bytes) -> tuple[Call, Callable[[], Awaitable[None]]]:
    import rnet

    client = rnet.Client()

    async def call() -> None:
        response = await client.post(url, headers=HEADERS, body=body)
        raw = bytes(await response.bytes())
        if response.status != 200:
            raise RuntimeError(f"status {response.status}")
        _parsed(raw)

    async def close() -> None:
        return None

    return call, close


async def _httpx_call(url: str, body: bytes) -> tuple[Call, Callable[[], Awaitable[None]]]:
    import httpx

    client = httpx.AsyncClient(limits=httpx.Limits(max_connections=None))

    async def call() -> None:
        response = await client.post(url, content=body, headers=HEADERS)
        if response.status_code != 200:
            raise RuntimeError(f"status {response.status_code}")
        _parsed(response.content)

    return call, client.aclose


MAKERS = {"gateway": _gateway_call, "aiohttp": _aiohttp_call, "pyreqwest": _pyreqwest_call,
          "rnet": _rnet_call, "httpx": _httpx_call}  # fmt: skip


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return usage.ru_utime + usage.ru_stime


async def _drive(client: str, url: str, concurrency: int, requests: int) -> dict[str, float]:
    call, close = await MAKERS[client](url, orjson.dumps(BODY))
    try:
        for _ in range(WARMUP_CALLS):
            await call()
        left = requests

        async def loop() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await call()

        cpu, start = _cpu_s(), time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - start, _cpu_s() - cpu
    finally:
        await close()
    return {"rps": requests / wall, "cpu_us": cpu / requests * 1e6}


def _child(client: str, url: str, concurrency: int, requests: int) -> None:
    import uvloop

    print(json.dumps(uvloop.run(_drive(client, url, concurrency, requests))))


def _run_child(client: str, url: str, concurrency: int, requests: int) -> dict[str, float]:
    command = [*taskset_prefix(GATEWAY_CORE), sys.executable, "-m", "bench.http_clients", "--child",
               client, "--url", url, "--concurrency", str(concurrency),
               "--requests", str(requests)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        sys.exit(f"{client} at c{concurrency} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default=",".join(CLIENTS),
                        help=f"a comma-separated subset of {','.join(CLIENTS)}")  # fmt: skip
    parser.add_argument("--concurrency", default="1,64", help="comma-separated, e.g. 1,64")
    parser.add_argument("--requests", type=int, default=4000, help="calls per run")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    if args.child:
        _child(args.child, args.url, concurrencies[0], args.requests)
        return 0

    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    unknown = sorted(set(clients) - set(CLIENTS))
    if unknown:
        sys.exit(f"--clients: unknown {', '.join(unknown)} (choose from {', '.join(CLIENTS)})")
    for client in list(clients):
        if importlib.util.find_spec(MODULES[client]) is None:
            print(f"{client}: not installed (pip install {MODULES[client]}); skipped")
            clients.remove(client)

    port = free_port()
    upstream = subprocess.Popen(
        [*taskset_prefix(LOAD_CORE), sys.executable, fake_upstream.__file__, "--port", str(port)],
        stdout=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}/v1"
        wait_http(base + "/models")
        url = base + "/chat/completions"
        print(f"CPU: {cpu_model()}; callers on core {GATEWAY_CORE}, upstream on {LOAD_CORE}")
        runs: dict[tuple[str, int], list[dict[str, float]]] = {}
        for repeat in range(args.repeat):
            order = clients[repeat % len(clients) :] + clients[: repeat % len(clients)]
            for concurrency in concurrencies:
                for client in order:
                    run = _run_child(client, url, concurrency, args.requests)
                    runs.setdefault((client, concurrency), []).append(run)
        _report(runs, clients, concurrencies)
    finally:
        upstream.terminate()
        upstream.wait(10)
    return 0


def _report(
    runs: dict[tuple[str, int], list[dict[str, float]]],
    clients: list[str],
    concurrencies: list[int],
) -> None:
    print(f"{'client':10s} {'c':>3s} {'req/s':>9s} {'CPU µs/call':>12s} {'vs gateway':>11s}")
    for concurrency in concurrencies:
        base = None
        if ("gateway", concurrency) in runs:
            base = statistics.median(r["cpu_us"] for r in runs[("gateway", concurrency)])
        for client in clients:
            done = runs[(client, concurrency)]
            rps = statistics.median(r["rps"] for r in done)
            cpu = statistics.median(r["cpu_us"] for r in done)
            ratio = f"{cpu / base:10.2f}x" if base else f"{'-':>11s}"
            print(f"{client:10s} {concurrency:3d} {rps:9.0f} {cpu:12.1f} {ratio}")


if __name__ == "__main__":
    sys.exit(main())
