"""Ejection and probe-back: the health state machine on a stepped clock, then a fleet watching
real loopback replicas that stop and start again."""

from __future__ import annotations

import pytest
from fleet_replica import EventRecorder, FakeReplica, body_homed_on, until

from gateway.providers.fleet.discovery import StaticDiscovery
from gateway.providers.fleet.fleet import Fleet, FleetSettings
from gateway.providers.fleet.health import HealthSettings, ReplicaHealth
from gateway.providers.fleet.picker import PickSettings
from gateway.providers.fleet.scrape import ScrapeSettings


class SteppedClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_scrape_failures_in_a_row_eject_and_a_success_in_between_resets_them() -> None:
    clock = SteppedClock()
    health = ReplicaHealth(HealthSettings(eject_after=3, backoff_s=1, backoff_max_s=8), clock)
    assert not health.scrape_failed("connect")
    assert not health.scrape_failed("connect")
    assert not health.succeeded()
    assert not health.scrape_failed("timeout")
    assert not health.scrape_failed("timeout")
    assert health.usable
    assert health.scrape_failed("timeout")
    assert not health.usable and health.last_error == "timeout"


def test_one_failed_request_ejects_at_once() -> None:
    health = ReplicaHealth(HealthSettings(), SteppedClock())
    assert health.request_failed("connect refused")
    assert not health.request_failed("again")  # already out: not a new ejection
    assert not health.usable


def test_a_scrape_that_began_before_the_ejection_does_not_readmit() -> None:
    clock = SteppedClock()
    health = ReplicaHealth(HealthSettings(), clock)
    began = clock()
    clock.now += 0.1
    health.request_failed("connect refused")  # while that scrape was on the wire
    clock.now += 0.1
    assert not health.succeeded(started_at=began) and not health.usable
    assert health.succeeded(started_at=clock()) and health.usable


def test_probes_back_off_doubling_to_the_cap_and_a_success_readmits() -> None:
    clock = SteppedClock()
    health = ReplicaHealth(HealthSettings(eject_after=1, backoff_s=1, backoff_max_s=8), clock)
    health.scrape_failed("connect")
    delays = []
    for _ in range(5):
        delays.append(health.probe_delay())
        assert not health.probe_due()
        clock.now += health.probe_delay()
        assert health.probe_due()
        health.scrape_failed("connect")  # the probe failed
    assert delays == [1, 2, 4, 8, 8]
    clock.now += health.probe_delay()
    assert health.succeeded() and health.usable
    # A replica that flaps right away waits the long backoff; one that stayed up starts afresh.
    health.request_failed("reset")
    assert health.probe_delay() == 8
    clock.now += 8
    health.succeeded()
    clock.now += 8
    health.succeeded()  # up for backoff_max_s: the past is forgotten
    health.request_failed("reset")
    assert health.probe_delay() == 1


def test_settings_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="eject_after"):
        HealthSettings(eject_after=0)
    with pytest.raises(ValueError, match="backoff_s"):
        HealthSettings(backoff_s=10, backoff_max_s=1)


FAST = FleetSettings(
    scrape=ScrapeSettings(interval_s=0.03, timeout_s=0.5),
    health=HealthSettings(eject_after=2, backoff_s=0.05, backoff_max_s=0.2),
    pick=PickSettings(routing="affinity"),
)


async def test_a_replica_that_dies_is_ejected_and_used_again_once_it_is_back() -> None:
    replicas = [await FakeReplica().start() for _ in range(3)]
    log = EventRecorder()
    fleet = Fleet("engines", StaticDiscovery([r.url for r in replicas]), FAST, log)
    await fleet.start()
    try:
        victim = replicas[1]
        await until(lambda: all(r.scrapes > 0 for r in replicas))
        body = body_homed_on(fleet, victim.url)

        await victim.stop()
        await until(lambda: not fleet.members.replicas[victim.url].health.usable)
        pick = fleet.pick(body)
        assert pick is not None and pick.replica != victim.url
        assert pick.reason == "ejected-skip"
        assert pick.candidates[0].replica == victim.url
        assert pick.candidates[0].verdict == "ejected"
        assert "connect" in (pick.candidates[0].detail or "")
        assert [e["replica"] for e in log.named("fleet_replica_ejected")] == [victim.url]
        # No request goes to it while it is out, whatever the prefix.
        for n in range(200):
            other = {"model": "tiny", "messages": [{"role": "user", "content": f"q{n}"}]}
            chosen = fleet.pick(other)
            assert chosen is not None and chosen.replica != victim.url

        await victim.start()  # same address and port
        await until(lambda: fleet.members.replicas[victim.url].health.usable)
        fresh = body_homed_on(fleet, victim.url, start=5000)
        pick = fleet.pick(fresh)
        assert pick is not None and (pick.replica, pick.reason) == (victim.url, "affinity")
        # The prefix that moved while it was out stays where its cache now is.
        assert [e["replica"] for e in log.named("fleet_replica_readmitted")] == [victim.url]
        stayed = fleet.pick(body)
        assert stayed is not None and stayed.replica != victim.url
        assert (stayed.reason, stayed.matched_blocks) == ("affinity", 1)
    finally:
        await fleet.close()
        for replica in replicas:
            await replica.stop()


async def test_a_failed_request_ejects_before_any_scrape_notices() -> None:
    replicas = [await FakeReplica().start() for _ in range(2)]
    slow = FleetSettings(
        scrape=ScrapeSettings(interval_s=60), health=HealthSettings(backoff_s=60, backoff_max_s=60)
    )
    fleet = Fleet("engines", StaticDiscovery([r.url for r in replicas]), slow, EventRecorder())
    await fleet.start()
    try:
        body = body_homed_on(fleet, replicas[0].url)
        with fleet.lease(replicas[0].url):
            fleet.request_failed(replicas[0].url, "connect: refused")
        # The request is retried elsewhere: its first choice is excluded and ejected.
        retry = fleet.pick(body, exclude={replicas[0].url})
        assert retry is not None and (retry.replica, retry.reason) == (replicas[1].url, "failover")
        later = fleet.pick(body)  # the prefix now lives where the retry went
        assert later is not None and (later.replica, later.reason) == (replicas[1].url, "affinity")
        fresh = fleet.pick(body_homed_on(fleet, replicas[0].url, start=5000))
        assert fresh is not None and fresh.reason == "ejected-skip"
        assert fleet.members.replicas[replicas[0].url].inflight == 0
    finally:
        await fleet.close()
        for replica in replicas:
            await replica.stop()


async def test_an_error_status_counts_as_a_failed_scrape_and_every_replica_out_is_unavailable() -> (
    None
):
    replica = await FakeReplica().start()
    fleet = Fleet("engines", StaticDiscovery([replica.url]), FAST, EventRecorder())
    await fleet.start()
    try:
        await until(lambda: replica.scrapes > 0)
        assert fleet.unavailable() is None
        replica.status = 503  # a Switchyard engine server whose engine died answers 503
        await until(lambda: not fleet.members.replicas[replica.url].health.usable)
        out = fleet.unavailable()
        assert out is not None and not out.spill and "ejected" in out.detail
        assert fleet.pick({"model": "tiny", "prompt": "x"}) is None
        replica.status = 200
        await until(lambda: fleet.unavailable() is None)
    finally:
        await fleet.close()
        await replica.stop()
