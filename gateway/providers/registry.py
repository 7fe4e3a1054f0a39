"""One provider client per policy provider, rebuilt only when that provider's config changes."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from gateway.errors import UpstreamError
from gateway.providers.openai_compat import OpenAICompatProvider, ResponseLimits, Timeouts
from gateway.routing.policy import ProviderConfig

if TYPE_CHECKING:
    from gateway.local_engine import LocalEngineHost
    from gateway.providers.local import LocalProvider


class ProviderRegistry:
    def __init__(
        self,
        timeouts: Timeouts,
        pool_size: int,
        local: LocalEngineHost | None = None,
        limits: ResponseLimits | None = None,
    ) -> None:
        self.timeouts = timeouts
        self.pool_size = pool_size
        self.limits = limits or ResponseLimits()
        self.local = local  # the in-process engine behind `kind: local`, when one is loaded
        self._clients: dict[str, OpenAICompatProvider] = {}
        self._retired: list[OpenAICompatProvider] = []

    def get(self, name: str, config: ProviderConfig) -> OpenAICompatProvider | LocalProvider:
        if config.kind == "local" and self.local is not None:
            return self.local.provider(name, config)
        client = self._clients.get(name)
        # Identity first: the policy object only changes on reload.
        if client is not None and (client.config is config or client.config == config):
            return client
        if config.kind != "openai_compatible":
            # A configuration gap, not a failure: the dispatcher moves on to the next candidate.
            raise UpstreamError(
                f"provider {name} of kind {config.kind} is not available in this gateway",
                status=503,
                retryable=False,
                kind="config",
                provider=name,
                code="provider_unavailable",
            )
        if client is not None:
            # In-flight requests may still use the old session; close it at shutdown.
            self._retired.append(client)
        client = OpenAICompatProvider(name, config, self.timeouts, self.pool_size, self.limits)
        self._clients[name] = client
        return client

    async def close(self) -> None:
        for client in [*self._clients.values(), *self._retired]:
            with contextlib.suppress(Exception):
                await client.close()
        self._clients.clear()
        self._retired.clear()
