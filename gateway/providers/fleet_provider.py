"""A fleet of engine replicas as one provider (``kind: engine_fleet``): pick, lease, send.

Every call picks a replica (``gateway.providers.fleet``: prefix affinity under bounded load,
replicas past ``spill_when`` and ejected ones skipped), counts the request on it while it runs
(a stream until it is closed) and sends it to ``<replica>/v1`` through the shared HTTP plumbing
(``HttpProvider.at(replica)``: one pooled session, the same timeouts, size caps,
error mapping, credential scrubbing and forwarded headers as any upstream). A replica speaks
OpenAI's Chat Completions; clients of other formats are translated by the gateway first.

A replica that fails the request before anything of the answer came back is reported to the
fleet (``request_failed``: ejected, then probed back) and the request goes to another replica,
each replica tried at most once: a connect error or connect timeout, a connection dropped
before the answer (the replica died), a 503, or, for a stream, any of these before its first
event (a stream is opened by reading its first event, so nothing has reached the client yet).
Anything else (a 4xx, a 500, a read timeout, an error event) is the request's answer and goes
to the dispatcher as is. When no replica is left, the last replica's error is raised, or a 503
``no_replica_available``. An upload (``forward``: a multipart body streamed through) goes to
one picked replica and is never sent twice: its body is read as it is sent.

``unavailable()`` is the fleet's: no replica, every replica ejected, or every usable one past
``spill_when`` (a spill: the dispatcher tries the other candidates first, and when it comes
back to the fleet as the last resort, the pick ignores ``spill_when``, as a local engine then
queues). Each answer carries the pick's ``route_note`` (``replica=10.0.0.5:8000 (affinity)``)
for ``x-switchyard-route``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar, Unpack

import aiohttp

from gateway.errors import UpstreamError
from gateway.formats.errors import ErrorInfo
from gateway.policy import FleetConfig, ProviderConfig, SpillWhen
from gateway.providers.base import (
    ForwardOptions,
    Headers,
    JsonCallOptions,
    RawReply,
    Unavailable,
    UpstreamResponse,
)
from gateway.providers.fleet.discovery import Discovery, DnsDiscovery, StaticDiscovery
from gateway.providers.fleet.explain import RoutePick
from gateway.providers.fleet.fleet import EventLog, Fleet, FleetSettings
from gateway.providers.fleet.health import HealthSettings
from gateway.providers.fleet.picker import PickSettings
from gateway.providers.fleet.prefix import PrefixSettings, Tokenizer
from gateway.providers.fleet.scrape import ScrapeSettings
from gateway.providers.http_provider import HttpProvider
from gateway.providers.http_upstream import SseStream
from gateway.settings import UpstreamSettings

# Where vLLM, SGLang and Switchyard serve the OpenAI API on a replica.
API_PREFIX = "/v1"
# Transport failures that mean the replica is gone (or going), not that the request is bad.
_GONE = (
    aiohttp.ClientConnectorError,
    aiohttp.ConnectionTimeoutError,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
    aiohttp.ClientPayloadError,
    ConnectionError,
)

OnPick = Callable[[str, RoutePick], None]
T = TypeVar("T")


def fleet_settings(config: FleetConfig, spill: SpillWhen | None) -> FleetSettings:
    """The fleet's settings from the policy's ``fleet:`` block and ``spill_when``."""
    scrape = config.scrape
    return FleetSettings(
        scrape=ScrapeSettings(
            interval_s=scrape.interval_ms / 1000,
            timeout_s=scrape.timeout_s,
            metrics_path=scrape.metrics_path,
            model_name=scrape.model_name,
        ),
        health=HealthSettings(
            eject_after=config.eject_after,
            backoff_s=config.probe_backoff_s,
            backoff_max_s=config.probe_backoff_max_s,
        ),
        pick=PickSettings(
            routing=config.routing,
            load_factor=config.load_factor,
            memory_entries=config.memory_entries,
            spill=SpillWhen() if spill is None else spill,
        ),
        prefix=PrefixSettings(
            blocks=config.prefix.blocks,
            block_chars=config.prefix.block_chars,
            block_tokens=config.prefix.block_tokens,
        ),
    )


def discovery_for(config: FleetConfig) -> Discovery:
    if config.dns is not None:
        return DnsDiscovery(config.dns, refresh_s=config.refresh_s)
    return StaticDiscovery(list(config.replicas or ()))


def replica_failure(error: UpstreamError) -> str | None:
    """Why ``error`` says the replica (not the request) failed before answering; None when
    it is the request's answer."""
    if error.upstream_status == 503:
        return "http 503"
    cause = error.__cause__
    if isinstance(cause, aiohttp.ConnectionTimeoutError):
        return "connect timeout"
    if isinstance(cause, _GONE):
        return f"unreachable ({type(cause).__name__})"
    return None


def load_tokenizer(path: str) -> Tokenizer:
    """A ``tokenizer.json`` as a text -> token ids callable (blocking: call off the loop)."""
    from tokenizers import Tokenizer as HfTokenizer

    tokenizer = HfTokenizer.from_file(path)
    return lambda text: tokenizer.encode(text, add_special_tokens=False).ids


class FleetProvider:
    def __init__(
        self,
        name: str,
        config: ProviderConfig,
        upstream: UpstreamSettings,
        log: EventLog,
        *,
        on_pick: OnPick | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        assert config.fleet is not None  # the policy requires it for this kind
        self.name = name
        self.config = config
        self.log = log
        self.on_pick = on_pick
        env = os.environ if env is None else env
        # The client side every replica shares: session, headers (the replicas' API key),
        # timeouts, caps and error mapping.
        self.http = HttpProvider(name, config, upstream)
        self.formats = self.http.formats
        self.door_paths = self.http.door_paths
        token_env = config.fleet.metrics_token_env
        token = env.get(token_env) if token_env else None
        self.fleet = Fleet(
            name,
            discovery_for(config.fleet),
            fleet_settings(config.fleet, config.spill_when),
            log,
            scrape_headers={"Authorization": f"Bearer {token}"} if token else None,
        )
        self.prefix_units = "chars"
        self._starting: asyncio.Task[None] | None = None
        self._closed = False
        self._leases = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Resolve the replicas and start watching them; once, however many callers wait."""
        if self._starting is None:
            self._starting = asyncio.get_running_loop().create_task(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        assert self.config.fleet is not None
        tokenizer_path = self.config.fleet.prefix.tokenizer
        if tokenizer_path:
            try:
                self.fleet.tokenizer = await asyncio.to_thread(load_tokenizer, tokenizer_path)
                self.prefix_units = "tokens"
            except Exception as exc:  # a missing package or file: affinity still works
                self.log.warning(
                    "fleet_tokenizer_unavailable",
                    fleet=self.name,
                    path=tokenizer_path,
                    error=f"{type(exc).__name__}: {exc}",
                    using="characters",
                )
        await self.fleet.start()

    @property
    def started(self) -> bool:
        return self._starting is not None and self._starting.done()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
            with contextlib.suppress(BaseException):
                await self._starting
        await self.fleet.close()
        await self.http.close()

    async def close_when_idle(self) -> None:
        """Close once the requests in flight here have ended (a provider a policy replaced)."""
        await self._idle.wait()
        await self.close()

    # --- what the dispatcher asks --------------------------------------------------------

    def unavailable(self) -> Unavailable | None:
        if not self.started:
            return None  # the call starts the fleet, then picks
        why = self.fleet.unavailable()
        return None if why is None else Unavailable(why.detail, spill=why.spill)

    def model_note(self) -> str | None:
        return None

    def stream_error(self, info: ErrorInfo) -> UpstreamError:
        return self.http.stream_error(info)

    def preview(self, body: Mapping[str, Any]) -> RoutePick | None:
        """The pick a request with this body would get now, changing nothing."""
        return self.fleet.pick(body, commit=False) or self.fleet.pick(
            body, commit=False, honor_spill=False
        )

    # --- calls ---------------------------------------------------------------------------

    async def post_json(
        self, path: str, body: dict[str, Any], **options: Unpack[JsonCallOptions]
    ) -> UpstreamResponse:
        async def send(pick: RoutePick) -> UpstreamResponse:
            with self._lease(pick.replica):
                return await self._sender(pick).post_json(path, body, **options)

        response, pick = await self._failover(body, send)
        return dataclasses.replace(response, route_note=pick.header_part())

    async def open_stream(
        self, path: str, body: dict[str, Any], *, headers: Headers | None = None
    ) -> FleetStream:
        async def send(pick: RoutePick) -> FleetStream:
            lease = contextlib.ExitStack()
            lease.enter_context(self._lease(pick.replica))
            stream: SseStream | None = None
            try:
                stream = await self._sender(pick).open_stream(path, body, headers=headers)
                batches = stream.batches()
                first = await anext(batches, None)  # nothing reaches the client before this
                if first is None:
                    raise self.http.http.protocol_error("ended a stream before its first event")
            except BaseException:
                if stream is not None:
                    stream.close()
                lease.close()
                raise
            return FleetStream(stream, batches, first, lease.close, pick.header_part())

        stream, _ = await self._failover(body, send)  # it carries its route_note
        return stream

    async def forward(
        self, path: str, body: bytes | AsyncIterable[bytes], **options: Unpack[ForwardOptions]
    ) -> RawReply:
        await self.start()
        pick = self._pick({"model": options["model"]}, set(), None)
        with self._lease(pick.replica):
            try:
                reply = await self._sender(pick).forward(path, body, **options)
            except UpstreamError as error:
                why = replica_failure(error)
                if why is not None:  # the replica is reported; the upload is not sent again
                    self.fleet.request_failed(pick.replica, why)
                raise
        return dataclasses.replace(reply, route_note=pick.header_part())

    # --- helpers -------------------------------------------------------------------------

    async def _failover(
        self, body: Mapping[str, Any], send: Callable[[RoutePick], Awaitable[T]]
    ) -> tuple[T, RoutePick]:
        """``send`` to one picked replica after another until one answers (or the error is
        the request's answer); the answer and the replica that gave it."""
        await self.start()
        tried: set[str] = set()
        last: UpstreamError | None = None
        while True:
            pick = self._pick(body, tried, last)
            try:
                return await send(pick), pick
            except UpstreamError as error:
                last = self._failed(pick, error, tried)

    def _pick(
        self, body: Mapping[str, Any], tried: set[str], last: UpstreamError | None
    ) -> RoutePick:
        """The next replica for this request; raises when none is left."""
        pick = self.fleet.pick(body, tried)
        if pick is None:  # the last resort: past spill_when is better than nothing
            pick = self.fleet.pick(body, tried, honor_spill=False)
        if pick is None:
            if last is not None:
                raise last
            why = self.fleet.unavailable()
            raise UpstreamError(
                why.detail if why else f"fleet {self.name} has no replica for this request",
                status=503,
                retryable=False,
                kind="unavailable",
                provider=self.name,
                code="no_replica_available",
            )
        if self.on_pick is not None:
            self.on_pick(self.name, pick)
        return pick

    def _failed(self, pick: RoutePick, error: UpstreamError, tried: set[str]) -> UpstreamError:
        """A replica's error: re-raised when it is the request's answer; else the replica
        is reported (ejected) and excluded, and the error kept in case no replica is left."""
        why = replica_failure(error)
        if why is None:
            raise error
        self.fleet.request_failed(pick.replica, why)
        tried.add(pick.replica)
        self.log.info("fleet_request_failed_over", fleet=self.name, replica=pick.label, reason=why)
        return error

    def _sender(self, pick: RoutePick) -> HttpProvider:
        """The shared HTTP side, sending to the picked replica's API."""
        return self.http.at(pick.replica + API_PREFIX)

    @contextlib.contextmanager
    def _lease(self, url: str) -> Iterator[None]:
        self._leases += 1
        self._idle.clear()
        try:
            with self.fleet.lease(url):
                yield
        finally:
            self._leases -= 1
            if self._leases == 0:
                self._idle.set()

    def describe(self) -> dict[str, Any]:
        """The fleet's replicas and settings, for the admin explain."""
        config = self.config.fleet
        assert config is not None
        return {
            "routing": config.routing,
            "source": {"dns": config.dns} if config.dns else {"replicas": config.replicas},
            "prefix_units": self.prefix_units,
            "started": self.started,
            "replicas": self.fleet.describe(),
        }


@dataclasses.dataclass(eq=False)
class FleetStream:
    """A replica's stream whose first events were read before the client saw anything; holds
    the replica's lease until it is closed or ends (``release``)."""

    stream: SseStream
    rest: AsyncIterator[list[bytes]]  # the stream's batches after ``first``
    first: list[bytes]
    release: Callable[[], None]
    route_note: str | None

    async def batches(self) -> AsyncIterator[list[bytes]]:
        try:
            yield self.first
            if self.first[-1] == b"[DONE]":
                return
            async for batch in self.rest:
                yield batch
        finally:
            self.release()

    def close(self) -> None:
        self.stream.close()
        self.release()
