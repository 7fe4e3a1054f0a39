"""The e2e routing rig: the test policy, a handle on the running gateway, and small helpers.

The policy keeps every wait short (0.6 s read timeout, 2 tries per candidate, 1 s breaker
cool-down) so that the whole folder runs in well under a minute and a half.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml
from fake_provider import FakeProviderFleet
from gateway_runner import RunningGateway

from gateway.routing.latency import LatencyTracker
from gateway.settings import BreakerSettings

BREAKER = BreakerSettings(
    consecutive_failures=3, failure_ratio=0.5, window=20, min_calls=4, cooldown_s=1.0
)


def base_policy(fleet: FakeProviderFleet) -> dict[str, Any]:
    """Three providers, one model each plus a canary build; one task per strategy."""
    return {
        "providers": {name: {"base_url": p.url} for name, p in fleet.providers.items()},
        "models": {
            # Prices are USD per 1M tokens; m-gamma is cheap to read and dear to write.
            "m-alpha": {"provider": "alpha", "price": {"input": 1.0, "output": 1.0}},
            "m-beta": {"provider": "beta", "price": {"input": 2.0, "output": 2.0}},
            "m-gamma": {"provider": "gamma", "price": {"input": 0.05, "output": 3.0}},
            "m-stable": {"provider": "gamma", "upstream_model": "stable-build"},
            "m-canary": {"provider": "beta", "upstream_model": "canary-build"},
        },
        "aliases": {"alpha": "m-alpha"},
        "default_task": "chat",
        "tasks": {
            "chat": {"strategy": "ordered", "candidates": ["m-alpha", "m-beta"]},
            "save": {"strategy": "cheapest", "candidates": ["m-alpha", "m-beta", "m-gamma"]},
            "speed": {"strategy": "lowest_latency", "candidates": ["m-alpha", "m-beta"]},
            "mix": {
                "strategy": "weighted",
                "candidates": ["m-alpha", "m-beta", "m-gamma"],
                "weights": {"m-alpha": 60, "m-beta": 30, "m-gamma": 10},
            },
            "rollout": {"strategy": "ordered", "candidates": ["m-stable"]},
        },
        "fallbacks": {"m-alpha": ["m-beta"]},
        "canaries": [{"from": "m-stable", "to": "m-canary", "percent": 30}],
    }


class RouteRig:
    """The running gateway plus what the tests need to drive and inspect it."""

    def __init__(self, gateway: RunningGateway, fleet: FakeProviderFleet, policy_path: Path):
        self.gateway = gateway
        self.fleet = fleet
        self.policy_path = policy_path
        self.key = gateway.create_key(name="e2e-routing")[1]

    # -- clients ----------------------------------------------------------------------------

    def client(self, **options: Any) -> openai.OpenAI:
        # max_retries=0: every success must be the gateway's doing, not the SDK's.
        return openai.OpenAI(
            base_url=self.gateway.v1, api_key=self.key, max_retries=0, timeout=20, **options
        )

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.gateway.v1, api_key=self.key, max_retries=0, timeout=20
        )

    def chat(self, task: str | None = None, **body: Any) -> tuple[Any, httpx.Headers]:
        """One non-streamed chat call; returns (completion, response headers)."""
        headers = {"X-Task-Type": task} if task else {}
        headers.update(body.pop("extra_headers", {}))
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
        body.setdefault("model", "auto")
        with self.client() as client:
            raw = client.chat.completions.with_raw_response.create(extra_headers=headers, **body)
        return raw.parse(), raw.headers

    def admin(self) -> httpx.Client:
        return self.gateway.admin()

    # -- state ------------------------------------------------------------------------------

    def metric(self, name: str, **labels: str) -> float | None:
        """One sample's value from /metrics, or None when the series is absent."""
        text = httpx.get(self.gateway.base_url + "/metrics", timeout=10).text
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            match = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})? (\S+)", line)
            if match and match[1] == name:
                have = ",".join(sorted((match[2] or "").split(","))) if match[2] else ""
                if have == wanted:
                    return float(match[3])
        return None

    def write_policy(self, data: dict[str, Any]) -> None:
        # Write beside, then rename: the watcher never sees half a file.
        temp = self.policy_path.with_suffix(".tmp")
        temp.write_text(yaml.safe_dump(data, sort_keys=False))
        temp.replace(self.policy_path)

    def policy_data(self) -> dict[str, Any]:
        return copy.deepcopy(base_policy(self.fleet))

    def reset(self) -> None:
        """Healthy providers, closed breakers, no latency history, the base policy."""
        self.fleet.reset()
        state = self.gateway.services.router.state
        state.breakers.reset(BREAKER)
        state.latency = LatencyTracker(state.latency.alpha)
        with self.admin() as admin:
            response = admin.put(
                "/admin/policy",
                content=yaml.safe_dump(self.policy_data(), sort_keys=False),
                headers={"content-type": "application/yaml"},
            )
        assert response.status_code == 200, response.text

    def log_events(self, event: str) -> list[dict[str, Any]]:
        """The gateway's JSON log lines of one event type, oldest first."""
        lines = (json.loads(line) for line in self.gateway.log.getvalue().splitlines() if line)
        return [line for line in lines if line.get("event") == event]
