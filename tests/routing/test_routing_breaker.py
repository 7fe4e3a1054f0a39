"""Circuit breaker: opens on consecutive failures or a failure ratio, probes, closes."""

from __future__ import annotations

import pytest

from gateway.routing.breaker import BreakerBoard
from gateway.settings import BreakerSettings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_consecutive_failures_then_half_opens_and_closes() -> None:
    clock = Clock()
    board = BreakerBoard(BreakerSettings(consecutive_failures=3, cooldown_s=10), clock)
    breaker = board.get("alpha", "big")
    for _ in range(2):
        assert breaker.allow()
        breaker.record_failure()
    assert board.states() == {"alpha/big": "closed"}
    breaker.record_failure()
    assert board.states() == {"alpha/big": "open"}
    assert not breaker.allow()
    clock.now += 9.9
    assert not breaker.allow()
    clock.now += 0.2
    assert board.state_of("alpha", "big") == "half_open"
    assert breaker.allow()  # the one probe
    assert not breaker.allow()  # no second probe while the first is out
    breaker.record_success()
    assert board.states() == {"alpha/big": "closed"}
    assert breaker.allow() and breaker.allow()


def test_failed_probe_reopens_for_a_full_cooldown() -> None:
    clock = Clock()
    board = BreakerBoard(BreakerSettings(consecutive_failures=1, cooldown_s=5), clock)
    breaker = board.get("beta", "other")
    breaker.record_failure()
    clock.now += 5
    assert breaker.allow()
    breaker.record_failure()
    assert breaker.state == "open"
    clock.now += 4
    assert not breaker.allow()
    clock.now += 1
    assert breaker.state == "half_open"


def test_failure_ratio_over_window_opens_without_a_streak() -> None:
    clock = Clock()
    settings = BreakerSettings(consecutive_failures=100, failure_ratio=0.5, window=10, min_calls=10)
    breaker = BreakerBoard(settings, clock).get("alpha", "small")
    # Alternate success/failure: never two failures in a row, but half of all calls fail.
    for i in range(9):
        breaker.record_failure() if i % 2 == 0 else breaker.record_success()
    assert breaker.state == "closed"  # 5 of 9 fail, but the window needs 10 calls
    breaker.record_success()
    assert breaker.state == "closed"  # the ratio is judged when a failure is recorded
    breaker.record_failure()  # last 10 calls hold 5 failures: ratio 0.5 reached
    assert breaker.state == "open"


def test_unknown_breakers_read_closed_and_probe_slot_can_be_released() -> None:
    clock = Clock()
    board = BreakerBoard(BreakerSettings(consecutive_failures=1, cooldown_s=1), clock)
    assert board.state_of("nobody", "none") == "closed"
    breaker = board.get("alpha", "big")
    breaker.record_failure()
    clock.now += 1
    assert breaker.allow()
    breaker.release_probe()  # the call never went out (provider full): let another probe
    assert breaker.allow()


def test_outcomes_while_open_neither_close_it_nor_move_the_cooldown() -> None:
    """A long stream let through before the breaker opened may end while it is open."""
    clock = Clock()
    breaker = BreakerBoard(BreakerSettings(consecutive_failures=2, cooldown_s=10), clock).get(
        "alpha", "big"
    )
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state == "open"
    clock.now += 6
    breaker.record_success()  # not the probe: stays open
    assert breaker.state == "open"
    breaker.record_failure()  # does not restart the 10 s cool-down
    clock.now += 4
    assert breaker.state == "half_open"
    assert breaker.allow()
    breaker.record_success()  # the probe's success closes it
    assert breaker.state == "closed"


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("consecutive_failures", 0, "consecutive_failures"),
        ("failure_ratio", 0.0, "failure_ratio"),
        ("failure_ratio", 1.5, "failure_ratio"),
        ("window", 0, "window"),
        ("min_calls", 21, "min_calls"),
        ("cooldown_s", -1.0, "cooldown_s"),
    ],
)
def test_bad_breaker_settings_are_refused(field: str, value: float, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        BreakerSettings(**{field: value})
