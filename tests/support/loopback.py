"""What every loopback provider of the tests stands on: an aiohttp app on 127.0.0.1 (a free
port), and an event loop on its own thread for providers that synchronous tests talk to."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from aiohttp import web

T = TypeVar("T")


class LoopbackServer:
    """``await start()`` serves the routes ``add_routes`` declares; ``url`` is then the
    OpenAI-style base (``http://127.0.0.1:<port>/v1``)."""

    client_max_size = 1024 * 1024
    # A client that hangs up cancels its handler (aiohttp's default is to let it run on).
    handler_cancellation = True

    def __init__(self) -> None:
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def base_url(self) -> str:
        return self.url

    def add_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        app = web.Application(client_max_size=self.client_max_size)
        self.add_routes(app)
        self._runner = web.AppRunner(
            app,
            access_log=None,
            shutdown_timeout=0.1,
            handler_cancellation=self.handler_cancellation,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

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
