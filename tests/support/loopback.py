"""What every loopback provider of the tests stands on: an aiohttp app on a loopback address
(127.0.0.1 and a free port unless given), an event loop on its own thread for providers that
synchronous tests talk to, and a fleet of named servers started together on one such loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable
from typing import Any, Generic, Self, TypeVar

from aiohttp import web

T = TypeVar("T")
S = TypeVar("S", bound="LoopbackServer")


class LoopbackServer:
    """``await start()`` serves the routes ``add_routes`` declares on ``host`` and ``port`` (a
    free one when 0, kept once chosen, so a server started again comes back on its address);
    ``url`` is then the OpenAI-style base (``http://127.0.0.1:<port>/v1``)."""

    name = "loopback"  # what a LoopbackFleet knows it by: each subclass names its servers
    client_max_size = 1024 * 1024
    # A client that hangs up cancels its handler (aiohttp's default is to let it run on).
    handler_cancellation = True

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    @property
    def origin(self) -> str:
        """``scheme://host:port``, no path."""
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return self.origin + "/v1"

    @property
    def base_url(self) -> str:
        return self.url

    def add_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def start(self) -> Self:
        app = web.Application(client_max_size=self.client_max_size)
        self.add_routes(app)
        self._runner = web.AppRunner(
            app,
            access_log=None,
            shutdown_timeout=0.1,
            handler_cancellation=self.handler_cancellation,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=1024, reuse_address=True)
        await site.start()
        if self.port == 0:
            self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class BackgroundLoop:
    """An event loop running on its own thread, as a context manager; ``run(coroutine)``
    runs one coroutine there and returns its result."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float = 10) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    def __enter__(self) -> BackgroundLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


class LoopbackFleet(Generic[S]):
    """Several servers with a ``name`` each (``fleet[name]``), all on one background loop,
    started for the ``with`` block and stopped at its end."""

    def __init__(self, servers: Iterable[S]) -> None:
        self.servers: dict[str, S] = {server.name: server for server in servers}
        self._loop = BackgroundLoop()

    def __getitem__(self, name: str) -> S:
        return self.servers[name]

    def __enter__(self) -> Self:
        self._loop.__enter__()
        for server in self.servers.values():
            self._loop.run(server.start())
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self.servers.values():
            self._loop.run(server.stop())
        self._loop.__exit__(*exc)


class ServedOnThread:
    """``with ServedOnThread(server) as server:``: ``server`` started on a background loop,
    stopped again at the end of the block."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self._loop = BackgroundLoop()

    def __enter__(self) -> Any:
        self._loop.__enter__()
        self._loop.run(self.server.start())
        return self.server

    def __exit__(self, *exc: object) -> None:
        self._loop.run(self.server.stop())
        self._loop.__exit__(*exc)
