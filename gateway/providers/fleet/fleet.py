"""A running fleet: discovery and scrape loops feeding the membership table that picks read.

``Fleet.start()`` resolves the replicas once, then keeps them current: a discovery task asks
again every ``refresh_s`` (DNS fleets), and one watcher task per replica scrapes its metrics
every ``scrape.interval_s``, or, while the replica is ejected, probes it when its backoff ends.
Requests use it synchronously and cheaply:

- ``pick(body, exclude)`` -> ``RoutePick`` or None (no replica can take a request now);
- ``lease(url)`` counts the request in flight while it runs (bounded load reads it);
- ``request_failed(url, error)`` ejects a replica a request could not reach; the caller then
  picks again with that replica excluded (when nothing was streamed yet).

All state lives in this object (built by whoever owns the provider) and changes only on the
event loop: no locks, no module globals.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Set
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from gateway.providers.fleet.discovery import Discovery, DiscoveryError
from gateway.providers.fleet.explain import RoutePick
from gateway.providers.fleet.health import HealthSettings
from gateway.providers.fleet.members import Members, MembershipChange, Replica
from gateway.providers.fleet.picker import Picker, PickSettings, past_spill
from gateway.providers.fleet.prefix import PrefixSettings, Tokenizer, prefix_hashes
from gateway.providers.fleet.scrape import ScrapeError, ScrapeSettings, scrape
from gateway.server.tasks import cancel_until_done


class EventLog(Protocol):
    """The slice of a structlog logger the fleet writes to."""

    def info(self, event: str, **fields: Any) -> Any: ...

    def warning(self, event: str, **fields: Any) -> Any: ...


@dataclass(frozen=True)
class FleetSettings:
    scrape: ScrapeSettings = field(default_factory=ScrapeSettings)
    health: HealthSettings = field(default_factory=HealthSettings)
    pick: PickSettings = field(default_factory=PickSettings)
    prefix: PrefixSettings = field(default_factory=PrefixSettings)


@dataclass(frozen=True)
class FleetUnavailable:
    """Why no replica can take a request; ``spill``: only because all usable ones are busy."""

    detail: str
    spill: bool


class Fleet:
    def __init__(
        self,
        name: str,
        discovery: Discovery,
        settings: FleetSettings,
        log: EventLog,
        *,
        scrape_headers: Mapping[str, str] | None = None,
        tokenizer: Tokenizer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.discovery = discovery
        self.settings = settings
        self.log = log
        self.scrape_headers = dict(scrape_headers or {})
        self.tokenizer = tokenizer
        self.members = Members(settings.health, clock)
        self.picker = Picker(settings.pick)
        self._session: aiohttp.ClientSession | None = None
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._discovering: asyncio.Task[None] | None = None

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Resolve the replicas and start watching them (returns without waiting for scrapes)."""
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit_per_host=2, keepalive_timeout=30),
            cookie_jar=aiohttp.DummyCookieJar(),  # a replica's answers set no state here
        )
        await self.refresh()
        if self.discovery.refresh_s is not None:
            self._discovering = asyncio.create_task(
                self._discover_forever(self.discovery.refresh_s), name=f"fleet-{self.name}-dns"
            )

    async def close(self) -> None:
        tasks = [*self._watchers.values()]
        if self._discovering is not None:
            tasks.append(self._discovering)
        await cancel_until_done(tasks)
        self._watchers.clear()
        self._discovering = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def refresh(self) -> MembershipChange | None:
        """Ask discovery once and apply the answer; None (members kept) when it fails."""
        try:
            urls = await self.discovery.resolve()
        except DiscoveryError as exc:
            self.log.warning("fleet_discovery_failed", fleet=self.name, error=str(exc))
            return None
        change = self.members.update(urls)
        for url in change.joined:
            self._watch(self.members.replicas[url])
        for url in change.removed:
            self._unwatch(url)
        if change.joined or change.draining or change.removed or change.returned:
            self.log.info(
                "fleet_membership_changed",
                fleet=self.name,
                joined=list(change.joined),
                draining=list(change.draining),
                removed=list(change.removed),
                returned=list(change.returned),
            )
        return change

    async def _discover_forever(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.refresh()
            except Exception as exc:  # a resolver's surprise must not end discovery for good
                self.log.warning("fleet_discovery_failed", fleet=self.name, error=repr(exc))

    # --- watching each replica -------------------------------------------------------------

    def _watch(self, replica: Replica) -> None:
        if self._session is None:
            return  # not started (or closed): nothing to scrape with
        self._watchers[replica.url] = asyncio.create_task(
            self._watch_forever(replica), name=f"fleet-{self.name}-scrape"
        )

    def _unwatch(self, url: str) -> None:
        task = self._watchers.pop(url, None)
        if task is not None:
            task.cancel()

    async def _watch_forever(self, replica: Replica) -> None:
        while True:
            delay = replica.health.probe_delay()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                await self.scrape_once(replica)
            except Exception as exc:  # a watcher that died would freeze this replica's state
                self.log.warning(
                    "fleet_scrape_crashed", fleet=self.name, replica=replica.url, error=repr(exc)
                )
                if replica.health.scrape_failed(type(exc).__name__):
                    self._ejected(replica, "metrics unreadable")
            await asyncio.sleep(self.settings.scrape.interval_s)

    async def scrape_once(self, replica: Replica) -> None:
        """Read one replica's metrics now and update its load and health."""
        assert self._session is not None
        started_at = replica.health.clock()
        try:
            load = await scrape(
                self._session, replica.url, self.settings.scrape, self.scrape_headers
            )
        except ScrapeError as exc:
            if replica.health.scrape_failed(str(exc)):
                self._ejected(replica, f"metrics {exc}")
            return
        replica.load = load
        if replica.health.succeeded(started_at):
            self.log.info("fleet_replica_readmitted", fleet=self.name, replica=replica.url)

    def _ejected(self, replica: Replica, why: str) -> None:
        self.log.warning(
            "fleet_replica_ejected",
            fleet=self.name,
            replica=replica.url,
            reason=why,
            probe_in_s=round(replica.health.probe_delay(), 3),
        )

    # --- what requests ask ----------------------------------------------------------------

    def prefix_hashes(self, body: Mapping[str, Any]) -> tuple[int, ...]:
        return prefix_hashes(body, self.settings.prefix, self.tokenizer)

    def pick(
        self,
        body: Mapping[str, Any],
        exclude: Set[str] = frozenset(),
        *,
        commit: bool = True,
        honor_spill: bool = True,
    ) -> RoutePick | None:
        """The replica for this request body now, or None when no replica can take it.
        ``commit=False`` explains without changing what later picks see; ``honor_spill=False``
        ignores ``spill_when`` (the fleet is the last resort)."""
        routing = self.settings.pick.routing
        hashes = None if routing == "round_robin" else self.prefix_hashes(body)
        return self.picker.pick(
            self.members.active(), hashes, exclude, commit=commit, honor_spill=honor_spill
        )

    def unavailable(self) -> FleetUnavailable | None:
        """None when some replica can take a request now; else why not."""
        active = self.members.active()
        if not active:
            return FleetUnavailable(f"fleet {self.name} has no replica", spill=False)
        usable = [replica for replica in active if replica.health.usable]
        if not usable:
            return FleetUnavailable(f"fleet {self.name}: every replica is ejected", spill=False)
        spill = self.settings.pick.spill
        if all(past_spill(spill, replica.load) is not None for replica in usable):
            return FleetUnavailable(f"fleet {self.name}: every replica is past spill_when", True)
        return None

    @contextlib.contextmanager
    def lease(self, url: str) -> Iterator[Replica]:
        """Count one request in flight on ``url`` for the duration of the block."""
        replica = self.members.acquire(url)
        try:
            yield replica
        finally:
            if self.members.release(url):
                self._unwatch(url)

    def request_failed(self, url: str, error: str) -> None:
        """A request could not reach ``url``: eject it (its watcher probes it back)."""
        replica = self.members.replicas.get(url)
        if replica is not None and replica.health.request_failed(error):
            self._ejected(replica, f"request {error}")

    def describe(self) -> list[dict[str, object]]:
        """Every replica's state, for the admin API."""
        return [replica.describe() for _, replica in sorted(self.members.replicas.items())]
