"""Loopback stand-ins for engine replicas, for the fleet tests.

``FakeReplica`` is a real aiohttp server on a loopback address serving ``/metrics`` the way a
vLLM server does (``vllm:num_requests_waiting``, ``vllm:gpu_cache_usage_perc`` ... labelled by
``model_name``). A test sets its numbers, or makes it answer an error status, and may stop and
start it again on the same address and port, as a replica that dies and comes back.
``EventRecorder`` keeps the events a fleet logs. ``until`` waits for a condition on the loop;
``body_homed_on`` finds a request whose prefix's ring home is a given replica.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from gateway.providers.fleet.fleet import Fleet


class FakeReplica:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, model: str = "tiny") -> None:
        self.host = host
        self.port = port
        self.model = model
        self.waiting = 0
        self.running = 0
        self.kv_usage = 0.0
        self.status = 200
        self.scrapes = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def page(self) -> str:
        label = f'{{engine="0",model_name="{self.model}"}}'
        return (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{label} {float(self.running)}\n"
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{label} {float(self.waiting)}\n"
            "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:gpu_cache_usage_perc gauge\n"
            f"vllm:gpu_cache_usage_perc{label} {self.kv_usage}\n"
            "# TYPE vllm:time_to_first_token_seconds histogram\n"
            f'vllm:time_to_first_token_seconds_bucket{{le="0.1",model_name="{self.model}"}} 3.0\n'
        )

    async def _metrics(self, _request: web.Request) -> web.Response:
        self.scrapes += 1
        if self.status != 200:
            return web.Response(status=self.status, text="engine unavailable")
        return web.Response(text=self.page(), content_type="text/plain")

    async def start(self) -> FakeReplica:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        if self.port == 0:
            self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class EventRecorder:
    """Takes the fleet's log events (the two methods of a structlog logger it calls)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    def warning(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [fields for name, fields in self.events if name == event]


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Return once ``condition()`` holds; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(0.01)


def body_homed_on(fleet: Fleet, url: str, start: int = 0) -> dict[str, object]:
    """A chat body (not seen before when ``start`` is new) whose ring home is ``url``."""
    ring = fleet.picker.ring({replica.url for replica in fleet.members.active()})
    for n in range(start, start + 1000):
        body = {"model": "tiny", "messages": [{"role": "system", "content": f"persona {n}"}]}
        if next(ring.walk(fleet.prefix_hashes(body)[0])) == url:
            return body
    raise AssertionError(f"no prefix homed on {url}")
