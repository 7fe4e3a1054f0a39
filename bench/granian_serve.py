"""The gateway under granian, for ``python -m bench.run --servers uvicorn,granian``.

A bench-side server only: the product serves with uvicorn (``switchyard serve``,
``gateway/cli/serve.py``). This builds the app as ``serve`` does, in the same order (the
settings from the environment, the policy checked, DATA_DIR locked and private, the secrets,
``create_app(settings)``, whose lifespan starts the embedded Redis on its unix socket, the usage
exporter and the SIGTERM drain), then runs it with granian's embedded server: one worker, in
this process, ASGI with its lifespan, HTTP/1.1 only (uvicorn's protocol is HTTP/1.1 only too),
on a uvloop event loop (as ``serve`` asks of uvicorn) with granian's asyncio task
implementation, one Rust runtime thread, no access log.

What uvicorn has in ``serve`` and this does not: the guarded httptools protocol
(``gateway/server/http_guard.py``), forwarded-header handling (``gateway/server/proxies.py``),
the keep-alive timeout and the bound on what is left after the drain. The drain itself is the
app's (``sigterm_drain`` hands SIGTERM on to the handler installed here, which stops granian).

``pip install granian`` (it is no dependency of the gateway).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

GRANIAN_MISSING = "granian is not installed: pip install granian"


def granian_version() -> str | None:
    """granian's version, or None when it is not installed."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("granian")
    except PackageNotFoundError:
        return None


async def _serve(app: object, host: str, port: int) -> None:
    from granian.constants import HTTPModes, Interfaces, TaskImpl
    from granian.log import LogLevels
    from granian.server.embed import Server

    server = Server(
        app,
        address=host,
        port=port,
        interface=Interfaces.ASGI,
        http=HTTPModes.http1,
        websockets=False,
        runtime_threads=1,
        task_impl=TaskImpl.asyncio,
        backlog=2048,  # uvicorn's default
        log_level=LogLevels.warning,
        log_access=False,
    )
    loop = asyncio.get_running_loop()

    def stop(*_: object) -> None:
        # A signal handler runs between bytecodes: the loop's thread-safe entry point only.
        loop.call_soon_threadsafe(server.stop)

    # The app's lifespan puts its drain in front of this one (gateway/server/shutdown.py).
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    await server.serve()


def main() -> int:
    if granian_version() is None:
        sys.exit(GRANIAN_MISSING)
    import uvloop

    from gateway.app import create_app
    from gateway.cli.output import fail
    from gateway.cli.serve import StartRefused, check_policy, lock_data_dir
    from gateway.data_dir import PRIVATE_UMASK, private_files
    from gateway.logs import configure_process_logging
    from gateway.settings import SettingsError, ensure_secrets, load_settings

    os.umask(PRIVATE_UMASK)  # as the CLI does for serve
    try:
        settings = load_settings()
    except SettingsError as exc:
        return fail(str(exc), 2)
    configure_process_logging(settings.log_level, settings.log_format)
    try:
        check_policy(settings)
        lock = lock_data_dir(settings)
    except StartRefused as exc:
        return fail(str(exc))
    with lock:
        private_files(settings.data_dir)
        ensure_secrets(settings)
        app = create_app(settings)
        print(
            f"Switchyard (granian {granian_version()}, uvloop) on "
            f"http://{settings.host}:{settings.port}",
            flush=True,
        )
        uvloop.run(_serve(app, settings.host, settings.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
