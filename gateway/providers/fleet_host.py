"""The policy's engine fleets in this gateway process: built, started, retired, stopped.

``provider_for`` is the registry's factory for ``kind: engine_fleet``: one ``FleetProvider`` per
provider name and config. ``start(policies)`` starts the fleets of the policy in force (their
first resolution and scrapes run before traffic) and then follows the policy: when a reload
edits or removes a fleet provider, the old one is retired (it takes no new request and closes
once the requests in flight on it have ended), and the fleets a new policy names are started.
``stop()`` closes them all.

The host also feeds the metrics: every pick (``switchyard_fleet_picks_total``) and each
replica's up, in-flight, waiting and KV-use gauges, read at scrape time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from gateway.metrics import FleetReplicaGauge, Metrics
from gateway.policy import Policy, ProviderConfig
from gateway.policy.store import PolicyStore
from gateway.providers.fleet.explain import RoutePick, replica_label
from gateway.providers.fleet.fleet import EventLog
from gateway.providers.fleet_provider import FleetProvider
from gateway.server.tasks import cancel_until_done
from gateway.settings import UpstreamSettings

FLEET_KIND = "engine_fleet"


class FleetHost:
    def __init__(
        self,
        upstream: UpstreamSettings,
        metrics: Metrics | None,
        log: EventLog,
        *,
        watch_interval_s: float = 0.5,
    ) -> None:
        self.upstream = upstream
        self.metrics = metrics
        self.log = log
        self.watch_interval_s = watch_interval_s
        self._live: dict[str, tuple[ProviderConfig, FleetProvider]] = {}
        self._retiring: dict[asyncio.Task[None], FleetProvider] = {}
        self._watch: asyncio.Task[None] | None = None
        if metrics is not None:
            metrics.watch_fleets(self.gauges)

    # --- the registry's factory ----------------------------------------------------------

    def provider_for(self, name: str, config: ProviderConfig) -> FleetProvider:
        live = self._live.get(name)
        if live is not None and (live[0] is config or live[0] == config):
            return live[1]
        provider = FleetProvider(name, config, self.upstream, self.log, on_pick=self._picked)
        self._live[name] = (config, provider)
        if live is not None:
            self._retire(live[1])
        return provider

    def provider(self, name: str) -> FleetProvider | None:
        """The live fleet provider ``name`` (None: no such fleet)."""
        live = self._live.get(name)
        return live[1] if live is not None else None

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self, policies: PolicyStore) -> None:
        """Start the policy's fleets, then follow policy reloads."""
        policy = policies.policy_or_none()
        await self._apply(policy)
        self._watch = asyncio.create_task(self._follow(policies, policy), name="fleet-policy")

    async def stop(self) -> None:
        if self._watch is not None:
            await cancel_until_done([self._watch])
            self._watch = None
        for task in self._retiring:
            task.cancel()  # shutting down: no waiting for their last requests
        providers = [provider for _, provider in self._live.values()]
        providers += self._retiring.values()
        self._live.clear()
        self._retiring.clear()
        await asyncio.gather(*(p.close() for p in providers), return_exceptions=True)

    async def _follow(self, policies: PolicyStore, seen: Policy | None) -> None:
        while True:
            await asyncio.sleep(self.watch_interval_s)
            current = policies.policy_or_none()
            if current is seen:
                continue
            seen = current
            try:
                await self._apply(current)
            except Exception as exc:  # one bad start must not end the watch
                self.log.warning("fleet_policy_apply_failed", error=repr(exc))

    async def _apply(self, policy: Policy | None) -> None:
        wanted = {
            name: config
            for name, config in (policy.providers.items() if policy is not None else ())
            if config.kind == FLEET_KIND
        }
        for name in [name for name in self._live if name not in wanted]:
            _, provider = self._live.pop(name)
            self._retire(provider)
        providers = [self.provider_for(name, config) for name, config in wanted.items()]
        await asyncio.gather(*(provider.start() for provider in providers))

    def _retire(self, provider: FleetProvider) -> None:
        try:
            task = asyncio.get_running_loop().create_task(provider.close_when_idle())
        except RuntimeError:  # no loop (not serving): the registry closes it at shutdown
            return
        self.log.info("fleet_retired", fleet=provider.name)
        self._retiring[task] = provider
        task.add_done_callback(lambda done: self._retiring.pop(done, None))

    # --- explain and metrics -------------------------------------------------------------

    def preview(
        self, name: str, config: ProviderConfig, body: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """What the fleet ``name`` would do with this body now (None: not a fleet)."""
        if config.kind != FLEET_KIND:
            return None
        provider = self.provider_for(name, config)
        pick = provider.preview(body)
        return {
            "pick": None if pick is None else pick.as_dict(),
            "header": None if pick is None else pick.header_part(),
            **provider.describe(),
        }

    def _picked(self, name: str, pick: RoutePick) -> None:
        if self.metrics is not None:
            self.metrics.fleet_picks.labels(name, pick.label, pick.reason).inc()

    def gauges(self) -> list[FleetReplicaGauge]:
        rows = []
        for name, (_, provider) in sorted(self._live.items()):
            for replica in provider.fleet.members.active():
                load = replica.load
                rows.append(
                    FleetReplicaGauge(
                        provider=name,
                        replica=replica_label(replica.url),
                        up=replica.health.usable,
                        inflight=replica.inflight,
                        waiting=None if load is None else load.waiting,
                        kv_usage=None if load is None else load.kv_usage,
                    )
                )
        return rows
