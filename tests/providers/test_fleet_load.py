"""Scraped load drives the pick: a loopback vLLM-style ``/metrics`` page (waiting queue, KV
cache use, labelled by model) moves requests off a busy or full replica and back."""

from __future__ import annotations

import contextlib

from fleet_replica import EventRecorder, FakeReplica, body_homed_on, until

from gateway.policy import SpillWhen
from gateway.providers.fleet.discovery import StaticDiscovery
from gateway.providers.fleet.fleet import Fleet, FleetSettings
from gateway.providers.fleet.picker import PickSettings
from gateway.providers.fleet.scrape import ScrapeSettings

SCRAPE = ScrapeSettings(interval_s=0.03, timeout_s=0.5, model_name="tiny")


def read(fleet: Fleet, replica: FakeReplica) -> tuple[int, float | None]:
    load = fleet.members.replicas[replica.url].load
    return (load.waiting, load.kv_usage) if load is not None else (-1, None)


async def test_a_vllm_style_metrics_endpoint_drives_the_load_decision() -> None:
    a, b = await FakeReplica().start(), await FakeReplica().start()
    settings = FleetSettings(
        scrape=SCRAPE, pick=PickSettings(memory_entries=0, spill=SpillWhen(kv_usage=0.9))
    )
    fleet = Fleet("engines", StaticDiscovery([a.url, b.url]), settings, EventRecorder())
    await fleet.start()
    try:
        await until(lambda: read(fleet, a) == (0, 0.0) and read(fleet, b) == (0, 0.0))
        body = body_homed_on(fleet, a.url)
        pick = fleet.pick(body)
        assert pick is not None and (pick.replica, pick.reason) == (a.url, "affinity")

        a.waiting = 40  # a deep queue: bounded load sends the request on
        await until(lambda: read(fleet, a) == (40, 0.0))
        pick = fleet.pick(body)
        assert pick is not None and (pick.replica, pick.reason) == (b.url, "load")
        # capacity = ceil(1.25 * (40 + 0 + 1) / 2) = 26
        assert pick.candidates[0].detail == "load 40 >= capacity 26"

        a.waiting, a.kv_usage = 0, 0.95  # past spill_when's KV threshold
        await until(lambda: read(fleet, a) == (0, 0.95))
        pick = fleet.pick(body)
        assert pick is not None and (pick.replica, pick.reason) == (b.url, "spill")
        assert pick.candidates[0].detail == "kv usage 0.95 > 0.9"

        a.kv_usage = 0.2
        await until(lambda: read(fleet, a) == (0, 0.2))
        pick = fleet.pick(body)
        assert pick is not None and (pick.replica, pick.reason) == (a.url, "affinity")

        a.kv_usage = b.kv_usage = 0.97  # every replica full: the fleet says spill
        await until(lambda: read(fleet, a)[1] == read(fleet, b)[1] == 0.97)
        assert fleet.pick(body) is None
        out = fleet.unavailable()
        assert out is not None and out.spill and "spill_when" in out.detail

        # Series of another model do not count toward this fleet's model.
        a.model, a.waiting, a.kv_usage, b.kv_usage = "other", 40, 0.97, 0.0
        await until(lambda: read(fleet, a) == (0, None) and read(fleet, b) == (0, 0.0))
        pick = fleet.pick(body)
        assert pick is not None and (pick.replica, pick.reason) == (a.url, "affinity")
    finally:
        await fleet.close()
        await a.stop()
        await b.stop()


async def test_least_loaded_follows_the_scraped_queues_and_requests_in_flight() -> None:
    a, b = await FakeReplica().start(), await FakeReplica().start()
    settings = FleetSettings(scrape=SCRAPE, pick=PickSettings(routing="least_loaded"))
    fleet = Fleet("engines", StaticDiscovery([a.url, b.url]), settings, EventRecorder())
    await fleet.start()
    try:
        a.waiting, b.waiting = 5, 1
        await until(lambda: read(fleet, a)[0] == 5 and read(fleet, b)[0] == 1)
        pick = fleet.pick({"model": "tiny", "prompt": "hello"})
        assert pick is not None and (pick.replica, pick.reason) == (b.url, "load")
        with contextlib.ExitStack() as leases:
            for _ in range(5):
                leases.enter_context(fleet.lease(b.url))
            busier = fleet.pick({"model": "tiny", "prompt": "hello"})  # b: 1 waiting + 5 here
            assert busier is not None and busier.replica == a.url
            assert {c.detail for c in busier.candidates if c.verdict == "busier"} == {"load 6 vs 5"}
        assert fleet.members.replicas[b.url].inflight == 0
        described = {entry["url"]: entry for entry in fleet.describe()}
        assert described[a.url]["waiting"] == 5 and described[b.url]["served"] == 5
        assert described[a.url]["state"] == "healthy"
    finally:
        await fleet.close()
        await a.stop()
        await b.stop()
