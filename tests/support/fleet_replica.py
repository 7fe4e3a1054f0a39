"""Loopback stand-ins for engine replicas, for the fleet tests.

``FakeReplica`` is a real aiohttp server on a loopback address that speaks like a vLLM server:

- ``/metrics`` in Prometheus text (``vllm:num_requests_waiting``, ``vllm:gpu_cache_usage_perc``
  ... labelled by ``model_name``), from the numbers a test sets (``waiting``, ``kv_usage``), or
  an error ``status``;
- ``/v1/chat/completions``, JSON or SSE, answering "served by <name>"; ``hold_s`` delays the
  answer (a stream: its first event), ``stall_s`` stalls a stream after its first event,
  ``chat_status`` answers that status with an OpenAI error envelope;
- ``/_control`` (POST the knobs above as JSON; GET: requests served), so that a replica running
  as its own process (``ReplicaProcess``, killed with SIGKILL) is driven like one in-process.

A test may stop and start an in-process replica again on the same address and port, as a replica
that dies and comes back. ``EventRecorder`` keeps the events a fleet logs. ``until`` waits for
a condition on the loop; ``body_homed_on`` finds a request whose prefix's ring home is a given
replica. Run as a script (``python fleet_replica.py --port N --name a``) it serves one replica
until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiohttp import web
from chat_answers import chat_chunk, chat_completion
from loopback import LoopbackServer

from gateway.providers.fleet.fleet import Fleet

KNOBS = ("waiting", "running", "kv_usage", "status", "chat_status", "hold_s", "stall_s", "model")


class ReplicaAddress:
    """A replica's ``url`` as a fleet lists it (``http://host:port``, no /v1) and its
    ``label`` in the fleet's logs and metrics (``host:port``)."""

    host: str
    port: int

    @property
    def label(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.label}"


class FakeReplica(ReplicaAddress, LoopbackServer):
    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, model: str = "tiny", name: str = "replica"
    ) -> None:
        super().__init__(host, port)
        self.model = model
        self.name = name
        self.waiting = 0
        self.running = 0
        self.kv_usage = 0.0
        self.status = 200  # of /metrics
        self.chat_status = 200  # of /v1/chat/completions
        self.hold_s = 0.0  # before the answer (a stream: before its first event)
        self.stall_s = 0.0  # a stream: after its first event
        self.scrapes = 0
        self.served = 0  # chat requests answered (or begun, for a stream)
        self.inflight = 0

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

    async def _control(self, request: web.Request) -> web.Response:
        if request.method == "POST":
            for knob, value in (await request.json()).items():
                if knob not in KNOBS:
                    return web.json_response({"error": f"unknown knob {knob}"}, status=400)
                setattr(self, knob, value)
        return web.json_response(
            {"served": self.served, "inflight": self.inflight, "scrapes": self.scrapes}
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if self.chat_status != 200:
            error = {"message": f"{self.name} says {self.chat_status}", "type": "server_error"}
            return web.json_response({"error": error}, status=self.chat_status)
        self.served += 1
        self.inflight += 1
        try:
            if body.get("stream") is True:
                return await self._stream(request, body)
            await asyncio.sleep(self.hold_s)
            usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
            answer = chat_completion(
                self.name,
                str(body.get("model")),
                f"served by {self.name}",
                usage,
                created=int(time.time()),
            )
            return web.json_response(answer)
        finally:
            self.inflight -= 1

    async def _stream(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        # Headers go out at once, as vLLM's do: only the events come late.
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(self.hold_s)
        model = str(body.get("model"))

        def event(delta: dict[str, Any], finish: str | None, **extra: Any) -> bytes:
            chunk = chat_chunk(self.name, model, delta, finish, created=0, **extra)
            return b"data: " + orjson.dumps(chunk) + b"\n\n"

        await response.write(event({"role": "assistant", "content": "served"}, None))
        await asyncio.sleep(self.stall_s)
        await response.write(event({"content": f" by {self.name}"}, None))
        usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
        await response.write(event({}, "stop", usage=usage))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_route("*", "/_control", self._control)


class ReplicaProcess(ReplicaAddress):
    """A ``FakeReplica`` in a process of its own: started, driven over ``/_control``, killed
    with SIGKILL (a replica that dies, connections and all) and started again on its port."""

    def __init__(self, port: int, name: str, log_dir: Path) -> None:
        self.host = "127.0.0.1"
        self.port = port
        self.name = name
        self.log_path = log_dir / f"replica-{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 20.0) -> ReplicaProcess:
        support = str(Path(__file__).resolve().parent)
        repo = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([support, repo])}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, __file__, "--port", str(self.port), "--name", self.name],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.stats()
                return self
            except httpx.HTTPError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"replica {self.name} did not start: {self.log_path}"
                    ) from None
                time.sleep(0.05)

    def set(self, **knobs: Any) -> None:
        httpx.post(self.url + "/_control", json=knobs, timeout=5).raise_for_status()

    def stats(self) -> dict[str, int]:
        return httpx.get(self.url + "/_control", timeout=5).json()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.process = None


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


async def _serve_forever(port: int, name: str) -> None:
    await FakeReplica(port=port, name=name).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="a fake vLLM-like replica, until killed")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="replica")
    arguments = parser.parse_args()
    asyncio.run(_serve_forever(arguments.port, arguments.name))
