"""Retries, fallbacks and breakers through the running gateway, seen by an openai SDK client.

Task ``chat`` is ordered [m-alpha (provider alpha), m-beta (provider beta)]; each candidate gets
2 tries, the read timeout is 0.6 s and the breakers open after 3 consecutive failures.
"""

from __future__ import annotations

import time

import openai
import pytest
from fake_provider import CUT, OK, RESET, Step
from polling import wait_for
from route_rig import BREAKER, RouteRig

STREAM_TEXT = "served by {}"


def attempts(rig: RouteRig, provider: str, model: str, outcome: str) -> float:
    return (
        rig.metric(
            "switchyard_upstream_attempts_total", provider=provider, model=model, outcome=outcome
        )
        or 0.0
    )


def breaker_state(rig: RouteRig, target: str) -> float | None:
    return rig.metric("switchyard_breaker_state", target=target)


def stream_chat(rig: RouteRig, **body: object) -> tuple[str, dict[str, str]]:
    """A streamed chat call: (the text the client assembled, the response headers)."""
    with rig.client() as client:
        raw = client.chat.completions.with_raw_response.create(
            model="auto",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            **body,  # type: ignore[arg-type]
        )
        text = "".join(
            chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices
        )
    return text, dict(raw.headers)


def test_5xx_is_retried_on_the_same_candidate(rig: RouteRig) -> None:
    failed_before = attempts(rig, "alpha", "m-alpha", "failed")
    rig.fleet["alpha"].play(Step("status", 503))
    completion, headers = rig.chat("chat")
    assert completion.choices[0].message.content == "served by alpha"
    assert headers["x-switchyard-model"] == "m-alpha"
    assert headers["x-switchyard-provider"] == "alpha"
    assert headers["x-switchyard-route"] == "task=chat; strategy=ordered; reason=ordered #1"
    assert rig.fleet["alpha"].hit_count() == 2
    assert attempts(rig, "alpha", "m-alpha", "failed") == failed_before + 1
    assert attempts(rig, "alpha", "m-alpha", "ok") >= 1


def test_429_retry_after_is_waited_for_or_skipped(rig: RouteRig) -> None:
    alpha = rig.fleet["alpha"]
    alpha.play(Step("retry_after", 1))
    _, headers = rig.chat("chat")
    assert headers["x-switchyard-model"] == "m-alpha"
    first, second = alpha.hits
    assert 0.95 <= second.at - first.at < 1.6, second.at - first.at
    # A Retry-After longer than the gateway will wait moves on to the next candidate at once.
    alpha.clear_hits()
    alpha.play(Step("retry_after", 60))
    started = time.monotonic()
    completion, headers = rig.chat("chat")
    assert time.monotonic() - started < 2.5  # far from 60 s: not waited for
    assert headers["x-switchyard-model"] == "m-beta"
    assert headers["x-switchyard-route"] == "task=chat; strategy=ordered; reason=ordered #2"
    assert completion.choices[0].message.content == "served by beta"
    assert alpha.hit_count() == 1


def test_timeouts_fall_back_within_the_budget(rig: RouteRig) -> None:
    rig.fleet["alpha"].play(then=Step("hang", 1.5))
    started = time.monotonic()
    completion, headers = rig.chat("chat")
    elapsed = time.monotonic() - started
    assert completion.choices[0].message.content == "served by beta"
    assert headers["x-switchyard-model"] == "m-beta"
    assert rig.fleet["alpha"].hit_count() == 2  # two tries, each cut at the 0.6 s read timeout
    assert 1.2 <= elapsed < 4.0, elapsed


def test_connection_reset_is_retried_then_served(rig: RouteRig) -> None:
    rig.fleet["alpha"].play(RESET)
    completion, headers = rig.chat("chat")
    assert headers["x-switchyard-model"] == "m-alpha"
    assert completion.choices[0].message.content == "served by alpha"
    assert rig.fleet["alpha"].hit_count() == 2
    # Reset on every try: the fallback serves, streaming included.
    rig.fleet["alpha"].play(then=RESET)
    text, headers = stream_chat(rig)
    assert text == STREAM_TEXT.format("beta")
    assert headers["x-switchyard-model"] == "m-beta"


def test_slow_first_byte_under_the_timeout_is_served(rig: RouteRig) -> None:
    rig.fleet["alpha"].play(then=Step("slow", 0.3))
    started = time.monotonic()
    _, headers = rig.chat("chat")
    assert time.monotonic() - started >= 0.3
    assert headers["x-switchyard-model"] == "m-alpha"
    text, headers = stream_chat(rig)
    assert text == STREAM_TEXT.format("alpha")
    assert rig.fleet["alpha"].hit_count() == 2  # no retry: slow is not failed


@pytest.mark.parametrize("failure", [Step("status", 500), Step("retry_after", 60), RESET])
def test_stream_falls_back_before_the_first_byte(rig: RouteRig, failure: Step) -> None:
    rig.fleet["alpha"].play(then=failure)
    text, headers = stream_chat(rig, stream_options={"include_usage": True})
    assert text == STREAM_TEXT.format("beta")
    assert headers["x-switchyard-model"] == "m-beta"
    assert headers["x-switchyard-provider"] == "beta"


def test_nothing_can_serve_is_a_clear_error(rig: RouteRig) -> None:
    rig.fleet["alpha"].play(then=Step("status", 500))
    rig.fleet["beta"].play(then=Step("status", 502))
    with pytest.raises(openai.APIStatusError) as caught:
        rig.chat(model="alpha")  # pinned via alias; m-beta is its fallback
    assert caught.value.status_code == 502
    body = caught.value.response.json()["error"]
    assert body["code"] == "upstream_unavailable"
    assert "beta" in body["message"]  # the last failure decides the message
    assert rig.fleet["alpha"].hit_count() == 2 and rig.fleet["beta"].hit_count() == 2


def test_rate_limited_everywhere_passes_retry_after_on(rig: RouteRig) -> None:
    rig.fleet["alpha"].play(then=Step("retry_after", 60))
    rig.fleet["beta"].play(then=Step("retry_after", 45))
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError) as caught:
        rig.chat("chat")
    assert time.monotonic() - started < 2.5  # neither wait is worth taking: no sleeping
    assert caught.value.response.headers["retry-after"] == "45"
    assert rig.fleet["alpha"].hit_count() == 1 and rig.fleet["beta"].hit_count() == 1


def test_breaker_opens_skips_and_closes_in_metrics(rig: RouteRig) -> None:
    alpha = rig.fleet["alpha"]
    alpha.play(then=Step("status", 500))
    skipped_before = attempts(rig, "alpha", "m-alpha", "skipped")
    fallbacks_before = (
        rig.metric("switchyard_route_fallbacks_total", first_model="m-alpha", served_model="m-beta")
        or 0.0
    )
    rig.chat("chat")  # 2 failures
    assert breaker_state(rig, "alpha/m-alpha") == 0
    rig.chat("chat")  # the 3rd consecutive failure opens it; no second try on an open breaker
    assert breaker_state(rig, "alpha/m-alpha") == 1
    assert alpha.hit_count() == 3
    for _ in range(3):  # open: alpha is not called at all, beta serves at once
        started = time.monotonic()
        _, headers = rig.chat("chat")
        assert time.monotonic() - started < 1.0  # no try, no backoff
        assert headers["x-switchyard-model"] == "m-beta"
    assert alpha.hit_count() == 3
    assert attempts(rig, "alpha", "m-alpha", "skipped") == skipped_before + 3
    fallbacks = rig.metric(
        "switchyard_route_fallbacks_total", first_model="m-alpha", served_model="m-beta"
    )
    assert fallbacks == fallbacks_before + 5
    # The upstream recovers; after the cool-down one probe goes through and closes the breaker.
    alpha.play()
    wait_for(lambda: breaker_state(rig, "alpha/m-alpha") == 2, BREAKER.cooldown_s + 1.0)
    _, headers = rig.chat("chat")
    assert headers["x-switchyard-model"] == "m-alpha"
    assert breaker_state(rig, "alpha/m-alpha") == 0
    assert breaker_state(rig, "beta/m-beta") == 0


def test_failed_half_open_probe_opens_the_breaker_again(rig: RouteRig) -> None:
    alpha = rig.fleet["alpha"]
    alpha.play(then=Step("status", 500))
    rig.chat("chat")
    rig.chat("chat")
    assert breaker_state(rig, "alpha/m-alpha") == 1
    wait_for(lambda: breaker_state(rig, "alpha/m-alpha") == 2, BREAKER.cooldown_s + 1.0)
    _, headers = rig.chat("chat")  # the probe fails: open again, beta serves
    assert headers["x-switchyard-model"] == "m-beta"
    assert alpha.hit_count() == 4
    assert breaker_state(rig, "alpha/m-alpha") == 1


def test_streams_cut_after_the_first_byte_open_the_breaker(rig: RouteRig) -> None:
    """A cut stream cannot fall back (bytes went out), but it is a failure for the breaker:
    N cut streams in a row open it by the consecutive rule (the ratio rule needs more calls)."""
    assert BREAKER.consecutive_failures < BREAKER.min_calls
    rig.fleet["alpha"].play(then=CUT)
    for cut in range(1, BREAKER.consecutive_failures + 1):
        assert breaker_state(rig, "alpha/m-alpha") in (None, 0), cut
        with pytest.raises(openai.APIError):
            stream_chat(rig)
    assert breaker_state(rig, "alpha/m-alpha") == 1
    text, headers = stream_chat(rig)
    assert text == STREAM_TEXT.format("beta")
    assert headers["x-switchyard-model"] == "m-beta"
    assert rig.fleet["alpha"].hit_count() == BREAKER.consecutive_failures
    # No latency sample from a cut stream: only clean ends teach the EWMA.
    assert rig.gateway.services.router.state.latency.samples("m-alpha") == 0


def expect_streams(rig: RouteRig, cut_pattern: str) -> None:
    """Stream once per letter: ``c`` must come back cut (an error), ``o`` whole from alpha."""
    for letter in cut_pattern:
        if letter == "c":
            with pytest.raises(openai.APIError):
                stream_chat(rig)
        else:
            assert stream_chat(rig)[0] == STREAM_TEXT.format("alpha")


def test_cut_streams_count_in_the_failure_ratio(rig: RouteRig) -> None:
    # Never two cuts in a row, but half of the last 4 streams (BREAKER.min_calls) were cut.
    assert (BREAKER.min_calls, BREAKER.failure_ratio) == (4, 0.5)
    rig.fleet["alpha"].play(CUT, OK, OK, CUT)
    expect_streams(rig, "coo")
    assert breaker_state(rig, "alpha/m-alpha") == 0
    expect_streams(rig, "c")
    assert breaker_state(rig, "alpha/m-alpha") == 1
    assert stream_chat(rig)[0] == STREAM_TEXT.format("beta")
    # Only the two clean ends taught the latency average.
    assert rig.gateway.services.router.state.latency.samples("m-alpha") == 2


def test_a_clean_stream_between_cuts_resets_the_streak(rig: RouteRig) -> None:
    breakers = rig.gateway.services.router.state.breakers
    breakers.reset(BREAKER.model_copy(update={"failure_ratio": 1.0, "min_calls": BREAKER.window}))
    rig.fleet["alpha"].play(CUT, CUT, OK, CUT, CUT, CUT)
    expect_streams(rig, "ccocc")
    assert breaker_state(rig, "alpha/m-alpha") == 0
    expect_streams(rig, "c")
    assert breaker_state(rig, "alpha/m-alpha") == 1
