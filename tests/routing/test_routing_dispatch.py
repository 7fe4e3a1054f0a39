"""Dispatcher against real loopback upstreams that fail: retries, fallbacks, breakers, limits."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from fake_provider import Step

from gateway.policy.store import PolicyStore
from gateway.routing.dispatch import Dispatcher, DispatchFailed
from gateway.routing.router import Router
from gateway.routing.state import RoutingState
from gateway.settings import BreakerSettings, RetrySettings

# The default retry policy (three tries a candidate), its waits cut short for the tests.
FAST = RetrySettings(
    initial_backoff_s=0.02,
    max_backoff_s=0.1,
    jitter_s=0.01,
    max_retry_after_s=2.0,
    total_budget_s=5.0,
)


@pytest.fixture
async def rig(policy_data, policy_file, upstreams, attempt_for):
    """Two real upstreams (alpha, beta) behind a policy; returns a small test harness."""
    alpha = await upstreams("alpha")
    beta = await upstreams("beta")

    class Rig:
        def __init__(self) -> None:
            self.alpha, self.beta = alpha, beta
            self.configure()

        def configure(self, settings=FAST, breaker=None, env=None, **provider_extra) -> None:
            data = policy_data()
            data["providers"]["alpha"]["base_url"] = alpha.url
            data["providers"]["beta"]["base_url"] = beta.url
            for provider, extra in provider_extra.items():
                data["providers"][provider].update(extra)
            self.store = PolicyStore(policy_file(data))
            self.store.load()
            self.state = RoutingState.build(breaker or BreakerSettings())
            self.router = Router(self.store, self.state)
            self.dispatcher = Dispatcher(self.state, settings, env=env or {})

        async def run(self, body, hold=False):
            route = self.router.plan(body=body, headers={}, key_id="k", allowed_models=None)
            return await self.dispatcher.run(route, attempt_for(route), hold=hold)

    return Rig()


def outcomes(result_or_error) -> list[tuple[str, str, int | None]]:
    return [(a.model, a.outcome, a.status) for a in result_or_error.attempts]


async def test_retries_5xx_then_succeeds_on_same_candidate(rig) -> None:
    rig.alpha.play(Step("status", 500), Step("status", 503))
    result = await rig.run({"model": "big"})
    assert result.candidate.model == "big" and result.value["id"] == "chatcmpl-alpha"
    assert outcomes(result) == [("big", "failed", 502), ("big", "failed", 502), ("big", "ok", None)]
    assert all(a.retry_in_s is not None and a.retry_in_s <= 0.12 for a in result.attempts[:2])
    assert rig.state.latency.estimate("big") is not None  # fed from the success


async def test_honours_retry_after_and_skips_long_ones(rig) -> None:
    rig.alpha.play(Step("retry_after", 1))
    result = await rig.run({"model": "big"})
    assert result.candidate.model == "big"
    gap = rig.alpha.hits[1].at - rig.alpha.hits[0].at
    assert 0.95 <= gap < 1.5, gap
    assert result.attempts[0].retry_in_s == 1.0
    # A Retry-After beyond max_retry_after_s is not waited for: on to the fallbacks at once.
    rig.alpha.play(then=Step("retry_after", 60))
    started = time.monotonic()
    result = await rig.run({"model": "best"})
    assert time.monotonic() - started < 1.0
    assert outcomes(result) == [
        ("big", "failed", 429),
        ("small", "failed", 429),
        ("other", "ok", None),
    ]


async def test_never_retries_other_4xx_and_passes_the_error_through(rig) -> None:
    rig.alpha.play(then=Step("status", 400))
    with pytest.raises(DispatchFailed) as caught:
        await rig.run({"model": "big"})
    error = caught.value
    assert error.status == 400 and len(rig.alpha.hits) == 1
    assert error.body()["error"]["message"] == "alpha failed with 400"
    assert outcomes(error) == [("big", "failed", 400)]


async def test_upstream_401_is_a_config_error_of_that_candidate(rig) -> None:
    rig.alpha.play(then=Step("status", 401))  # big and small both live on alpha
    result = await rig.run({"model": "big"})
    assert result.candidate.model == "other" and result.value["id"] == "chatcmpl-beta"
    assert outcomes(result) == [
        ("big", "failed", 401),
        ("small", "failed", 401),
        ("other", "ok", None),
    ]


async def test_connection_resets_and_timeouts_fall_back(rig) -> None:
    rig.configure(alpha={"timeout_s": 0.3})
    rig.alpha.play("reset", then=Step("hang", 2.0))
    started = time.monotonic()
    result = await rig.run({"model": "best"})
    elapsed = time.monotonic() - started
    assert result.value["id"] == "chatcmpl-beta" and result.candidate.model == "other"
    kinds = [(a.model, a.kind) for a in result.attempts if a.outcome == "failed"]
    assert kinds[0] == ("big", "connect")
    assert ("big", "timeout") in kinds
    assert elapsed < 3.0


async def test_slow_first_byte_within_timeout_is_served_and_measured(rig) -> None:
    rig.alpha.play(then=Step("slow", 0.2))
    result = await rig.run({"model": "big"})
    assert result.candidate.model == "big"
    assert 0.2 <= result.attempts[0].duration_s < 1.0
    assert rig.state.latency.estimate("big") >= 0.2


async def test_total_time_budget_bounds_retries(rig) -> None:
    rig.configure(
        RetrySettings(
            max_tries_per_candidate=10,
            initial_backoff_s=0.1,
            max_backoff_s=0.1,
            jitter_s=0,
            total_budget_s=0.6,
        ),
        breaker=BreakerSettings(consecutive_failures=1000, window=1000, min_calls=1000),
    )
    rig.alpha.play(then=Step("status", 500))
    rig.beta.play(then=Step("status", 500))
    started = time.monotonic()
    with pytest.raises(DispatchFailed) as caught:
        await rig.run({"model": "big"})
    assert time.monotonic() - started < 1.5
    assert caught.value.status == 502
    tries = Counter(a.model for a in caught.value.attempts if a.outcome == "failed")
    # ~0.6 s of 0.1 s backoffs on big, far from the 50 allowed; the fallbacks get one try
    # each, with no backoff, as less than one backoff of the budget remains.
    assert 3 <= tries["big"] <= 7
    assert (tries["small"], tries["other"]) == (1, 1)


async def test_breaker_opens_and_later_requests_skip_the_candidate(rig) -> None:
    rig.configure(breaker=BreakerSettings(consecutive_failures=3, cooldown_s=60))
    rig.alpha.play(then=Step("status", 500))
    first = await rig.run({"model": "big"})  # big fails 3× → open; small fails 3× → open
    assert first.candidate.model == "other"
    assert rig.state.breakers.states() == {
        "alpha/big": "open",
        "alpha/small": "open",
        "beta/other": "closed",
    }
    hits = len(rig.alpha.hits)
    second = await rig.run({"model": "big"})
    assert second.candidate.model == "other" and len(rig.alpha.hits) == hits
    assert [(a.model, a.detail) for a in second.attempts[:2]] == [
        ("big", "breaker open"),
        ("small", "breaker open"),
    ]
    route = rig.router.plan(body={"model": "big"}, headers={}, key_id="k", allowed_models=None)
    assert rig.dispatcher.preview(route)[0]["verdict"] == "skipped: breaker open"


async def test_provider_at_max_concurrency_is_skipped_not_queued(rig) -> None:
    rig.configure(alpha={"max_concurrency": 1})
    rig.alpha.play(Step("slow", 0.5))
    slow = asyncio.create_task(rig.run({"model": "big"}))
    await asyncio.sleep(0.15)  # the slow one holds alpha's only slot
    started = time.monotonic()
    fast = await rig.run({"model": "big"})
    assert time.monotonic() - started < 0.4
    assert fast.candidate.model == "other"
    assert [(a.model, a.detail) for a in fast.attempts[:2]] == [
        ("big", "provider at max_concurrency (1)"),
        ("small", "provider at max_concurrency (1)"),
    ]
    assert (await slow).candidate.model == "big"
    assert rig.state.inflight.count("alpha") == 0


async def test_hold_keeps_the_slot_until_release(rig) -> None:
    rig.configure(alpha={"max_concurrency": 1})
    held = await rig.run({"model": "big"}, hold=True)
    assert rig.state.inflight.count("alpha") == 1
    assert (await rig.run({"model": "big"})).candidate.model == "other"
    held.release()
    held.release()  # idempotent
    assert rig.state.inflight.count("alpha") == 0
    assert (await rig.run({"model": "big"})).candidate.model == "big"


async def test_missing_api_key_skips_to_next_candidate(rig) -> None:
    rig.configure(alpha={"api_key_env": "ALPHA_KEY"}, env={"OTHER": "x"})
    result = await rig.run({"model": "big"})
    assert result.candidate.model == "other" and rig.alpha.hits == []
    assert result.attempts[0].detail == "missing API key: ALPHA_KEY is not set"
    rig.configure(alpha={"api_key_env": "ALPHA_KEY"}, beta={"api_key_env": "BETA_KEY"})
    with pytest.raises(DispatchFailed) as caught:
        await rig.run({"model": "big"})
    assert caught.value.status == 503 and caught.value.code == "upstream_not_configured"


async def test_dispatch_adapter_matches_foundation_signature(rig) -> None:
    route = rig.router.plan(body={"model": "other"}, headers={}, key_id="k", allowed_models=None)

    async def attempt(candidate):
        return candidate.upstream_model

    served, value = await rig.dispatcher.dispatch(route, attempt)
    assert (served.model, value) == ("other", "other")


async def test_held_call_is_judged_only_when_it_ends(rig) -> None:
    """hold=True (a stream): no breaker or latency verdict at the first byte; failed() counts
    as a failure in the consecutive rule, succeeded() as a success with its first-byte time."""
    rig.configure(breaker=BreakerSettings(consecutive_failures=2, cooldown_s=60))
    breaker = rig.state.breakers.get("alpha", "big")
    for _ in range(2):
        held = await rig.run({"model": "big"}, hold=True)
        assert held.candidate.model == "big" and rig.state.inflight.count("alpha") == 1
        assert rig.state.latency.estimate("big") is None
        held.failed()
        held.succeeded()  # too late: the first verdict stands
        held.release()
        assert rig.state.inflight.count("alpha") == 0
    assert breaker.state == "open"  # two cut streams in a row
    assert rig.state.latency.estimate("big") is None

    rig.configure(breaker=BreakerSettings(consecutive_failures=2, cooldown_s=60))
    rig.alpha.play(Step("slow", 0.1))
    held = await rig.run({"model": "big"}, hold=True)
    rig.state.breakers.get("alpha", "big").record_failure()  # another call failed meanwhile
    held.succeeded()
    assert rig.state.latency.estimate("big") == held.attempts[-1].duration_s >= 0.1
    rig.state.breakers.get("alpha", "big").record_failure()
    assert rig.state.breakers.state_of("alpha", "big") == "closed"  # the success broke the streak


async def test_held_probe_keeps_the_breaker_half_open_until_the_stream_ends(rig) -> None:
    rig.configure(breaker=BreakerSettings(consecutive_failures=1, cooldown_s=0.1))
    rig.alpha.play(Step("status", 500))
    assert (await rig.run({"model": "big"})).candidate.model == "small"
    assert rig.state.breakers.state_of("alpha", "big") == "open"
    await asyncio.sleep(0.15)
    probe = await rig.run({"model": "big"}, hold=True)
    assert probe.candidate.model == "big"
    assert rig.state.breakers.state_of("alpha", "big") == "half_open"
    other = await rig.run({"model": "big"})  # the probe is still out: no second one
    assert (other.candidate.model, other.attempts[0].detail) == ("small", "breaker half_open")
    route = rig.router.plan(body={"model": "big"}, headers={}, key_id="k", allowed_models=None)
    verdict = rig.dispatcher.preview(route)[0]["verdict"]
    assert verdict == "skipped: breaker half_open (probe in flight)"
    probe.release()  # the client left: no verdict, but the probe slot is free again
    assert rig.state.breakers.state_of("alpha", "big") == "half_open"
    probe = await rig.run({"model": "big"}, hold=True)
    assert probe.candidate.model == "big"
    probe.succeeded()
    assert rig.state.breakers.state_of("alpha", "big") == "closed"
    assert rig.state.inflight.count("alpha") == 0
