"""Routing test fixtures: policy files and scripted loopback upstreams that fail on cue."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.routing.router import Candidate, RoutePlan

BASE_POLICY: dict[str, Any] = {
    "providers": {
        "alpha": {"base_url": "http://127.0.0.1:9/v1"},
        "beta": {"base_url": "http://127.0.0.1:9/v1"},
        "home": {"kind": "local", "engine": {}, "spill_when": {"waiting": 4, "kv_usage": 0.9}},
    },
    "models": {
        "big": {
            "provider": "alpha",
            "price": {"input": 2.0, "output": 8.0, "cached_input": 0.5},
            "capabilities": ["code", "vision"],
        },
        "small": {
            "provider": "alpha",
            "price": {"input": 0.4, "output": 1.6},
            "capabilities": ["code", "fast"],
        },
        "wordy": {
            # Cheap to read, dear to write: wins short-output requests only.
            "provider": "beta",
            "price": {"input": 0.05, "output": 20.0},
            "capabilities": ["fast"],
        },
        "other": {"provider": "beta", "price": {"input": 1.0, "output": 1.0}},
        "tiny": {"provider": "home", "upstream_model": "tiny-local"},
    },
    "aliases": {"best": "big", "cheap": "small"},
    "default_task": "chat",
    "tasks": {
        "chat": {"strategy": "ordered", "candidates": ["big", "other"], "fallbacks": ["tiny"]},
        "save": {"strategy": "cheapest", "candidates": ["big", "small", "wordy"]},
        "speed": {"strategy": "lowest_latency", "candidates": ["big", "small", "other"]},
        "mix": {
            "strategy": "weighted",
            "candidates": ["big", "small", "other"],
            "weights": {"big": 70, "small": 20, "other": 10},
        },
        "code": {
            "strategy": "cheapest",
            "candidates": ["big", "small", "wordy", "other"],
            "require_capabilities": ["code"],
            "max_price_per_mtok": 5,
        },
    },
    "fallbacks": {"big": ["small"], "small": ["other"]},
    "canaries": [],
}


@pytest.fixture
def policy_data() -> Callable[..., dict[str, Any]]:
    """A fresh copy of the base policy, with top-level overrides."""

    def make(**overrides: Any) -> dict[str, Any]:
        data = copy.deepcopy(BASE_POLICY)
        data.update(copy.deepcopy(overrides))
        return data

    return make


@pytest.fixture
def policy_file(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    def write(data: dict[str, Any]) -> Path:
        path = tmp_path / "routing_rules.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write


class ScriptedUpstream:
    """A real OpenAI-ish HTTP server on 127.0.0.1 that plays a script of behaviours.

    Each request pops the next step (the last one repeats): ``"ok"``, ``("status", code)``,
    ``("retry_after", seconds)`` (429 + Retry-After), ``("hang", s)`` (no response for s),
    ``"reset"`` (drop the connection), ``("slow", s)`` (200 after s seconds before the first byte).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.script: list[Any] = ["ok"]
        self.hits: list[float] = []
        self.models: list[str] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    def play(self, *steps: Any) -> None:
        self.script = list(steps)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.hits.append(time.monotonic())
        self.models.append(body.get("model"))
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        kind, arg = (step, None) if isinstance(step, str) else step
        if kind == "status":
            return web.json_response(
                {"error": {"message": f"{self.name} says {arg}", "type": "x", "code": str(arg)}},
                status=arg,
            )
        if kind == "retry_after":
            return web.json_response(
                {"error": {"message": "slow down", "type": "rate_limit"}},
                status=429,
                headers={"Retry-After": str(arg)},
            )
        if kind == "hang":
            await asyncio.sleep(arg)
        if kind == "reset":
            assert request.transport is not None
            request.transport.abort()
            await asyncio.sleep(0.05)
            raise web.HTTPInternalServerError()
        if kind == "slow":
            await asyncio.sleep(arg)
        return web.json_response(
            {"id": "x", "object": "chat.completion", "model": body.get("model"), "by": self.name}
        )


@pytest.fixture
async def upstreams() -> AsyncIterator[Callable[[str], Any]]:
    started: list[ScriptedUpstream] = []

    async def make(name: str) -> ScriptedUpstream:
        upstream = ScriptedUpstream(name)
        await upstream.start()
        started.append(upstream)
        return upstream

    yield make
    for upstream in started:
        await upstream.stop()


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class AiohttpAttempt:
    """The attempt function the dispatcher drives: one POST per call, errors → UpstreamError."""

    def __init__(self, session: aiohttp.ClientSession, plan: RoutePlan) -> None:
        self.session = session
        self.plan = plan

    async def __call__(self, candidate: Candidate) -> dict[str, Any]:
        assert self.plan.policy is not None
        provider = self.plan.policy.providers[candidate.provider]
        timeout = aiohttp.ClientTimeout(
            sock_connect=provider.connect_timeout_s, sock_read=provider.timeout_s
        )
        url = f"{provider.base_url}/chat/completions"
        payload = {"model": candidate.upstream_model, "messages": []}
        try:
            async with self.session.post(url, json=payload, timeout=timeout) as response:
                data = await response.json(content_type=None)
                if response.status == 200:
                    return data
                retryable = response.status == 429 or response.status >= 500
                raise UpstreamError(
                    f"{candidate.provider} answered {response.status}",
                    status=response.status if response.status < 500 else 502,
                    retryable=retryable,
                    retry_after_s=_retry_after(response.headers),
                    kind="status",
                    provider=candidate.provider,
                    upstream_body=data if response.status < 500 else None,
                )
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"{candidate.provider} timed out", provider=candidate.provider
            ) from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(
                f"{candidate.provider} connection failed: {type(exc).__name__}",
                kind="connect",
                provider=candidate.provider,
            ) from exc


@pytest.fixture
async def attempt_for() -> AsyncIterator[Callable[[RoutePlan], AiohttpAttempt]]:
    """``attempt_for(plan)``: an aiohttp attempt function on one shared pooled session."""
    session = aiohttp.ClientSession()
    yield lambda plan: AiohttpAttempt(session, plan)
    await session.close()
