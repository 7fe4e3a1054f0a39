"""Discovery: a DNS name re-resolved on the loop (an injected resolver standing in for a
headless Service's records, and the loop's getaddrinfo on localhost), replicas joining,
draining and leaving, DNS failures that keep what is known, and static lists."""

from __future__ import annotations

import pytest
from fleet_replica import EventRecorder, FakeReplica, until

from gateway.providers.fleet.discovery import (
    DiscoveryError,
    DnsDiscovery,
    StaticDiscovery,
    address_url,
    getaddrinfo_resolver,
)
from gateway.providers.fleet.fleet import Fleet, FleetSettings
from gateway.providers.fleet.scrape import ScrapeSettings


class HeadlessService:
    """The records of a headless Service, as a resolver callable that tests edit."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses
        self.asked: list[tuple[str, int]] = []
        self.failing = False

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        if self.failing:
            raise OSError("Temporary failure in name resolution")
        return list(self.addresses)


async def test_pods_join_drain_and_leave_as_the_records_change() -> None:
    first = await FakeReplica("127.0.0.1").start()
    port = first.port  # every pod listens on the Service's port, on its own address
    second = await FakeReplica("127.0.0.2", port).start()
    third = await FakeReplica("127.0.0.3", port).start()
    service = HeadlessService(["127.0.0.1", "127.0.0.2"])
    discovery = DnsDiscovery(f"http://engines.test:{port}", refresh_s=0.03, resolver=service)
    log = EventRecorder()
    settings = FleetSettings(scrape=ScrapeSettings(interval_s=0.03))
    fleet = Fleet("engines", discovery, settings, log)
    await fleet.start()
    try:
        assert sorted(fleet.members.replicas) == [first.url, second.url]
        assert service.asked[0] == ("engines.test", port)
        await until(lambda: first.scrapes > 0 and second.scrapes > 0)
        kept = fleet.members.replicas[second.url]

        with fleet.lease(first.url):  # a request still running on the pod that goes away
            service.addresses = ["127.0.0.2", "127.0.0.3"]
            await until(lambda: third.url in fleet.members.replicas and third.scrapes > 0)
            assert fleet.members.replicas[second.url] is kept  # a staying pod keeps its state
            leaving = fleet.members.replicas[first.url]
            assert leaving.draining and leaving.inflight == 1
            for n in range(100):
                pick = fleet.pick({"model": "tiny", "prompt": f"prompt {n}"})
                assert pick is not None and pick.replica != first.url
        assert first.url not in fleet.members.replicas  # gone once its last request ended
        scrapes = first.scrapes
        await until(lambda: third.scrapes > 3)
        assert first.scrapes == scrapes  # nor is it scraped any more

        service.addresses = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
        await until(lambda: first.url in fleet.members.replicas)
        changes = log.named("fleet_membership_changed")
        assert changes[0]["joined"] == [first.url, second.url]
        assert {"joined": [third.url], "draining": [first.url]}.items() <= changes[1].items()
        assert changes[-1]["joined"] == [first.url]
    finally:
        await fleet.close()
        for replica in (first, second, third):
            await replica.stop()


async def test_a_failed_or_empty_resolution_keeps_the_known_replicas() -> None:
    service = HeadlessService(["10.0.0.1", "10.0.0.2"])
    discovery = DnsDiscovery("http://engines.test:8080", refresh_s=60, resolver=service)
    log = EventRecorder()
    fleet = Fleet("engines", discovery, FleetSettings(), log)
    # Not started: no scrapes, only the membership table.
    assert (await fleet.refresh()) is not None
    service.failing = True
    assert (await fleet.refresh()) is None
    service.failing, service.addresses = False, []
    assert (await fleet.refresh()) is None
    assert sorted(fleet.members.replicas) == ["http://10.0.0.1:8080", "http://10.0.0.2:8080"]
    errors = [event["error"] for event in log.named("fleet_discovery_failed")]
    assert "name resolution" in errors[0] and "no address" in errors[1]


async def test_the_loops_getaddrinfo_resolves_localhost() -> None:
    urls = await DnsDiscovery("http://localhost:8123").resolve()
    assert "http://127.0.0.1:8123" in urls
    # A name the resolver cannot even encode (a 70-character label) fails here, not on the wire.
    with pytest.raises(DiscoveryError, match="cannot resolve"):
        await getaddrinfo_resolver("a" * 70 + ".test", 80)
    with pytest.raises(ValueError, match="not a valid DNS name"):
        DnsDiscovery("http://" + "a" * 70 + ".test:80")


def test_urls_are_checked_and_ipv6_bracketed() -> None:
    assert address_url("http", "fd00::5", 8080) == "http://[fd00::5]:8080"
    assert address_url("https", "10.0.0.5", 443) == "https://10.0.0.5:443"
    static = StaticDiscovery(["http://b:8000/", "http://a:8000", "http://b:8000"])
    assert static.urls == ["http://a:8000", "http://b:8000"] and static.refresh_s is None
    with pytest.raises(ValueError, match="scheme://host:port only"):
        StaticDiscovery(["http://a:8000/v1"])
    with pytest.raises(ValueError, match="http:// or https://"):
        StaticDiscovery(["ftp://a"])
    with pytest.raises(ValueError, match="at least one"):
        StaticDiscovery([])
    with pytest.raises(ValueError, match="port"):
        DnsDiscovery("http://engines.test")
