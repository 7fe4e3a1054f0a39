"""The fleet's membership table: each replica's latest load, health and requests in flight.

``update(urls)`` applies what discovery found: new URLs join; a URL that is still listed keeps
its replica (load, health and counts intact); a URL no longer listed is marked draining. A
draining replica takes no new request and leaves the table once its last request in flight
ends (``release``), or at once when it has none. A draining URL that is listed again is
simply active again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gateway.providers.fleet.health import HealthSettings, ReplicaHealth
from gateway.providers.fleet.scrape import ReplicaLoad


@dataclass
class Replica:
    url: str  # base URL, e.g. http://10.1.2.3:8080; also the replica's id
    health: ReplicaHealth
    load: ReplicaLoad | None = None  # the latest successful scrape
    inflight: int = 0  # requests from this gateway not yet finished
    draining: bool = False
    served: int = field(default=0)  # requests this gateway sent it (for explain and tests)

    @property
    def waiting(self) -> int:
        return self.load.waiting if self.load is not None else 0

    @property
    def load_units(self) -> int:
        """What bounded-load routing counts: in flight from here + the replica's own queue."""
        return self.inflight + self.waiting

    def describe(self) -> dict[str, object]:
        load = self.load
        return {
            "url": self.url,
            "inflight": self.inflight,
            "served": self.served,
            "draining": self.draining,
            "waiting": None if load is None else load.waiting,
            "running": None if load is None else load.running,
            "kv_usage": None if load is None else load.kv_usage,
            **self.health.describe(),
        }


@dataclass(frozen=True)
class MembershipChange:
    joined: tuple[str, ...]
    draining: tuple[str, ...]
    removed: tuple[str, ...]
    returned: tuple[str, ...]  # were draining, listed again


class Members:
    def __init__(self, health: HealthSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.health = health
        self.clock = clock
        self.replicas: dict[str, Replica] = {}

    def active(self) -> list[Replica]:
        """Replicas that may take new requests if healthy (not draining), in URL order."""
        return sorted(
            (replica for replica in self.replicas.values() if not replica.draining),
            key=lambda replica: replica.url,
        )

    def update(self, urls: Iterable[str]) -> MembershipChange:
        listed = set(urls)
        joined, draining, removed, returned = [], [], [], []
        for url in sorted(listed):
            replica = self.replicas.get(url)
            if replica is None:
                self.replicas[url] = Replica(url, ReplicaHealth(self.health, self.clock))
                joined.append(url)
            elif replica.draining:
                replica.draining = False
                returned.append(url)
        for url, replica in sorted(self.replicas.items()):
            if url in listed:
                continue
            if not replica.draining:
                replica.draining = True
                draining.append(url)
            if replica.inflight == 0:
                removed.append(url)
        for url in removed:
            del self.replicas[url]
        return MembershipChange(tuple(joined), tuple(draining), tuple(removed), tuple(returned))

    def acquire(self, url: str) -> Replica:
        """Count one more request in flight on ``url`` (KeyError: not a member)."""
        replica = self.replicas[url]
        replica.inflight += 1
        replica.served += 1
        return replica

    def release(self, url: str) -> bool:
        """One request on ``url`` ended; True when that removed a drained replica."""
        replica = self.replicas.get(url)
        if replica is None:
            return False
        replica.inflight = max(replica.inflight - 1, 0)
        if replica.draining and replica.inflight == 0:
            del self.replicas[url]
            return True
        return False
