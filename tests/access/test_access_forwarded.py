"""Whose failed admin credentials count, on real ``switchyard serve`` processes: forwarded
headers are believed only from ``SWITCHYARD_TRUSTED_PROXIES``, so nobody can lock out an
address they do not have (or dodge the throttle with a new ``X-Forwarded-For`` per guess), and
failures from one client address never refuse a right credential from another one, even behind
one shared proxy. Guessing from one address is still throttled, the right key included.

Each test speaks from loopback addresses of its own (127.0.0.x); the throttle counts per
address, so they do not mix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from fake_upstream import FakeUpstream, ThreadedFakeUpstream
from marked_gateway import ADMIN_KEY, MarkedGateway, write_policy

from gateway.settings import SettingsError, load_settings

pytestmark = pytest.mark.slow

LIMIT = 10
PROXY = "127.0.0.30"  # the one trusted proxy of the `proxied` gateway


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with ThreadedFakeUpstream() as fake:
        yield fake


def _gateway(directory: Path, upstream: FakeUpstream, **settings: object) -> MarkedGateway:
    return MarkedGateway(
        directory / "data",
        write_policy(directory, upstream.base_url),
        auth_failure_limit=LIMIT,
        auth_failure_window_s=3600,
        **settings,
    ).start()


@pytest.fixture(scope="module")
def direct(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream):
    """No proxy configured (the default)."""
    process = _gateway(tmp_path_factory.mktemp("direct"), upstream)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream):
    """Behind one trusted proxy, as deploy/k8s runs it behind its ingress."""
    process = _gateway(tmp_path_factory.mktemp("proxied"), upstream, trusted_proxies=PROXY)
    try:
        yield process
    finally:
        process.stop()


def _keys(gateway: MarkedGateway, peer: str, key: str, forwarded_for: str | None = None) -> int:
    """``GET /admin/keys`` with ``key`` from the TCP peer ``peer``; the status."""
    headers = {"Authorization": f"Bearer {key}"}
    if forwarded_for is not None:
        headers["X-Forwarded-For"] = forwarded_for
    transport = httpx.HTTPTransport(local_address=peer)
    with httpx.Client(base_url=gateway.base_url, transport=transport, timeout=30) as client:
        return client.get("/admin/keys", headers=headers).status_code


def _guesses(gateway: MarkedGateway, peer: str, count: int, forwarded_for: str | None) -> list:
    return [_keys(gateway, peer, f"wrong-admin-key-{n}", forwarded_for) for n in range(count)]


def _failed_clients(gateway: MarkedGateway) -> list[str]:
    """The ``client`` of every ``admin_auth_failed`` line the gateway logged."""
    clients = []
    for line in gateway.output().splitlines():
        if line.startswith("{") and '"admin_auth_failed"' in line:
            event = orjson.loads(line)
            if event.get("event") == "admin_auth_failed":
                clients.append(event["client"])
    return clients


def test_forwarded_for_from_an_untrusted_peer_changes_nothing(direct: MarkedGateway) -> None:
    # 127.0.0.1 is no proxy unless listed: its X-Forwarded-For neither picks whose
    # failures these are, nor gives each guess a fresh address.
    spoofed = [f"203.0.113.{n}" for n in range(LIMIT + 5)]
    statuses = [_keys(direct, "127.0.0.1", f"wrong-{n}", spoofed[n]) for n in range(LIMIT + 5)]
    assert statuses == [403] * LIMIT + [429] * 5, statuses
    assert _failed_clients(direct) == ["127.0.0.1"] * LIMIT
    assert _keys(direct, "127.0.0.1", ADMIN_KEY) == 429  # guessing from there has stopped
    assert _keys(direct, "127.0.0.11", ADMIN_KEY) == 200  # another address is not affected


def test_behind_a_trusted_proxy_each_client_has_its_own_count(proxied: MarkedGateway) -> None:
    # A client guessing through the proxy is throttled by its own address, the right key too.
    assert _guesses(proxied, PROXY, LIMIT, "198.51.100.9") == [403] * LIMIT
    assert _keys(proxied, PROXY, "wrong-again", "198.51.100.9") == 429
    assert _keys(proxied, PROXY, ADMIN_KEY, "198.51.100.9") == 429
    # Another client of the same proxy is not: the proxy's own address counts nothing.
    assert _keys(proxied, PROXY, ADMIN_KEY, "203.0.113.7") == 200
    # What a client writes into X-Forwarded-For itself is left of what the proxy appends
    # (the address it saw): the right-most address that is no trusted proxy counts.
    assert _guesses(proxied, PROXY, LIMIT, "203.0.113.7, 192.0.2.50") == [403] * LIMIT
    assert _keys(proxied, PROXY, ADMIN_KEY, "192.0.2.50") == 429
    assert _keys(proxied, PROXY, ADMIN_KEY, "203.0.113.7") == 200
    assert _failed_clients(proxied) == ["198.51.100.9"] * LIMIT + ["192.0.2.50"] * LIMIT


def test_only_the_listed_proxies_are_believed(proxied: MarkedGateway) -> None:
    # 127.0.0.1 is not the listed proxy: its failures are its own, whatever it forwards.
    before = len(_failed_clients(proxied))
    assert _guesses(proxied, "127.0.0.1", LIMIT, "203.0.113.8") == [403] * LIMIT
    assert _failed_clients(proxied)[before:] == ["127.0.0.1"] * LIMIT
    assert _keys(proxied, "127.0.0.1", ADMIN_KEY, "203.0.113.8") == 429
    assert _keys(proxied, PROXY, ADMIN_KEY, "203.0.113.8") == 200


def test_trusted_proxies_must_be_addresses_or_networks() -> None:
    settings = load_settings(_env_file=None, trusted_proxies=" 10.0.0.7/8, ::1 ,192.0.2.1")
    assert settings.trusted_proxies == "10.0.0.0/8,::1,192.0.2.1"
    for wrong in ("ingress.local", "*", "10.0.0.0/33"):
        with pytest.raises(SettingsError, match="SWITCHYARD_TRUSTED_PROXIES"):
            load_settings(_env_file=None, trusted_proxies=wrong)
