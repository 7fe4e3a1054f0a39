"""Breaker and retry thresholds come from SWITCHYARD_* settings: bad values stop start-up
naming the variable; good ones reach the running gateway's breakers and dispatcher."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import yaml
from fake_provider import CUT, FakeProviderFleet
from gateway_runner import GatewayThread, RunningGateway, make_settings
from route_rig import base_policy

from gateway.cli import main
from gateway.settings import BreakerSettings, RetrySettings, SettingsError, load_settings

ROUTING_ENV = {
    "SWITCHYARD_BREAKER_CONSECUTIVE_FAILURES": "2",
    "SWITCHYARD_BREAKER_FAILURE_RATIO": "1",
    "SWITCHYARD_BREAKER_WINDOW": "8",
    "SWITCHYARD_BREAKER_MIN_CALLS": "8",
    "SWITCHYARD_BREAKER_COOLDOWN_S": "0.5",
    "SWITCHYARD_UPSTREAM_BACKOFF_INITIAL_S": "0.01",
    "SWITCHYARD_UPSTREAM_BACKOFF_MAX_S": "0.05",
    "SWITCHYARD_UPSTREAM_BACKOFF_JITTER_S": "0",
    "SWITCHYARD_UPSTREAM_MAX_RETRY_AFTER_S": "2",
    "SWITCHYARD_ROUTE_LATENCY_ALPHA": "0.5",
}


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("SWITCHYARD_BREAKER_CONSECUTIVE_FAILURES", "0", "greater than or equal to 1"),
        ("SWITCHYARD_BREAKER_FAILURE_RATIO", "1.5", "less than or equal to 1"),
        ("SWITCHYARD_BREAKER_FAILURE_RATIO", "half", "valid number"),
        ("SWITCHYARD_BREAKER_WINDOW", "0", "greater than or equal to 1"),
        ("SWITCHYARD_BREAKER_MIN_CALLS", "21", "must not exceed SWITCHYARD_BREAKER_WINDOW (20)"),
        ("SWITCHYARD_BREAKER_COOLDOWN_S", "0", "greater than 0"),
        ("SWITCHYARD_UPSTREAM_BACKOFF_MAX_S", "0.1", "at least SWITCHYARD_UPSTREAM_BACKOFF_INIT"),
        ("SWITCHYARD_UPSTREAM_MAX_RETRY_AFTER_S", "-1", "greater than or equal to 0"),
        ("SWITCHYARD_ROUTE_LATENCY_ALPHA", "0", "greater than 0"),
    ],
)
def test_bad_routing_setting_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, words: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as caught:
        load_settings(_env_file=None)
    message = str(caught.value)
    assert f"{variable}: " in message and words in message, message


def test_serve_refuses_a_bad_breaker_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SWITCHYARD_BREAKER_MIN_CALLS", "50")
    assert main(["serve"]) == 2
    assert "SWITCHYARD_BREAKER_MIN_CALLS" in capsys.readouterr().err


@pytest.fixture
def tuned_gateway(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fleet: FakeProviderFleet, redis_url: str
) -> Iterator[RunningGateway]:
    """A gateway whose breaker and retry thresholds come from the environment only."""
    for variable, value in ROUTING_ENV.items():
        monkeypatch.setenv(variable, value)
    fleet.reset()
    policy_path = tmp_path / "routing_rules.yaml"
    policy_path.write_text(yaml.safe_dump(base_policy(fleet), sort_keys=False))
    runner = GatewayThread(make_settings(tmp_path, policy_path, redis_url))
    try:
        yield runner.start()
    finally:
        runner.stop()
        fleet.reset()


def test_thresholds_from_settings_reach_breakers_and_dispatcher(
    tuned_gateway: RunningGateway, fleet: FakeProviderFleet
) -> None:
    services = tuned_gateway.services
    assert services.router.state.breakers.settings == BreakerSettings(
        consecutive_failures=2, failure_ratio=1.0, window=8, min_calls=8, cooldown_s=0.5
    )
    assert services.router.state.latency.alpha == 0.5
    assert services.dispatcher.settings == RetrySettings(
        max_tries_per_candidate=1,
        initial_backoff_s=0.01,
        max_backoff_s=0.05,
        jitter_s=0.0,
        max_retry_after_s=2.0,
        total_budget_s=30.0,
    )
    _, key = tuned_gateway.create_key(name="tuned")
    client = openai.OpenAI(base_url=tuned_gateway.v1, api_key=key, max_retries=0, timeout=20)

    def stream() -> tuple[str, str]:
        raw = client.chat.completions.with_raw_response.create(
            model="m-alpha", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        return text, raw.headers["x-switchyard-model"]

    def alpha_breaker() -> str:
        return services.router.state.breakers.state_of("alpha", "m-alpha")

    alpha = fleet["alpha"]
    alpha.play(CUT, CUT)  # then healthy again
    with pytest.raises(openai.APIError):
        stream()
    assert alpha_breaker() == "closed"
    with pytest.raises(openai.APIError):
        stream()
    assert alpha_breaker() == "open"  # the configured 2 cut streams in a row, not the default 5
    assert stream() == ("served by beta", "m-beta")
    assert alpha.hit_count() == 2
    time.sleep(0.6)  # the configured 0.5 s cool-down, not the default 30 s
    assert stream() == ("served by alpha", "m-alpha")  # the probe ends cleanly: closed again
    assert alpha_breaker() == "closed"
    client.close()
