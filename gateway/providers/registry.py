"""One provider per policy provider, built by its kind's factory and rebuilt only when that
provider's config changes.

The factories (``kind`` → ``(name, config) -> Provider``) are handed in by the services wiring,
so this module knows no implementation: a gateway without the engine imports none of it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

from gateway.errors import UpstreamError
from gateway.policy import ProviderConfig
from gateway.providers.base import Provider

ProviderFactory = Callable[[str, ProviderConfig], Provider]


class ProviderRegistry:
    def __init__(self, factories: Mapping[str, ProviderFactory]) -> None:
        self._factories = dict(factories)
        self._providers: dict[str, tuple[ProviderConfig, Provider]] = {}
        self._retired: list[Provider] = []

    def get(self, name: str, config: ProviderConfig) -> Provider:
        known = self._providers.get(name)
        # Identity first: the policy object only changes on reload.
        if known is not None and (known[0] is config or known[0] == config):
            return known[1]
        factory = self._factories.get(config.kind)
        if factory is None:
            # A configuration gap, not a failure: the dispatcher moves on to the next candidate.
            raise UpstreamError(
                f"provider {name} of kind {config.kind} is not available in this gateway",
                status=503,
                retryable=False,
                kind="config",
                provider=name,
                code="provider_unavailable",
            )
        if known is not None:
            # In-flight requests may still use the old one (its pooled session): closed at
            # shutdown.
            self._retired.append(known[1])
        provider = factory(name, config)
        self._providers[name] = (config, provider)
        return provider

    async def close(self) -> None:
        for provider in [*(p for _, p in self._providers.values()), *self._retired]:
            with contextlib.suppress(Exception):
                await provider.close()
        self._providers.clear()
        self._retired.clear()
