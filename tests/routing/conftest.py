"""Routing test fixtures: policy files, loopback providers that fail on cue, and a running
gateway in front of three of them (the route rig)."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from fake_provider import FakeProvider, FakeProviderFleet
from gateway_runner import GatewayThread, make_settings
from route_rig import RouteRig, base_policy

from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.policy import Candidate
from gateway.routing.router import RoutePlan

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


@pytest.fixture
async def upstreams() -> AsyncIterator[Callable[[str], Any]]:
    """``await upstreams(name)``: a scripted loopback provider, served on the test's loop."""
    started: list[FakeProvider] = []

    async def make(name: str) -> FakeProvider:
        upstream = FakeProvider(name)
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


@pytest.fixture(scope="session")
def fleet() -> Iterator[FakeProviderFleet]:
    with FakeProviderFleet("alpha", "beta", "gamma") as providers:
        yield providers


@pytest.fixture(scope="module")
def route_rig(
    tmp_path_factory: pytest.TempPathFactory, fleet: FakeProviderFleet, redis_url: str
) -> Iterator[RouteRig]:
    folder = tmp_path_factory.mktemp("e2e-routing")
    policy_path = folder / "routing_rules.yaml"
    policy_path.write_text(yaml.safe_dump(base_policy(fleet), sort_keys=False))
    settings = make_settings(
        folder,
        policy_path,
        redis_url,
        upstream_read_timeout_s=0.6,
        upstream_connect_timeout_s=0.5,
        upstream_max_tries=2,
        upstream_retry_budget_s=6.0,
    )
    runner = GatewayThread(settings)
    running = runner.start()
    try:
        yield RouteRig(running, fleet, policy_path)
    finally:
        runner.stop()


@pytest.fixture
def rig(route_rig: RouteRig) -> RouteRig:
    route_rig.reset()
    return route_rig
