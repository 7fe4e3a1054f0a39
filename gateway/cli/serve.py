"""``switchyard serve``: run the gateway (uvicorn, uvloop + httptools).

Each check fails fast with one line on stderr, in order: the policy file, the DATA_DIR lock (a
second gateway on it names the first's pid), the secrets, the port; only then does the app
(embedded Redis included) start. The admin key is printed only when it was just generated.
With no policy file (and no ``SWITCHYARD_POLICY_FILE``) the shipped default is served, said in
one line. SIGINT and SIGTERM end it with exit status 0, once it has drained.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
from typing import Any

from gateway.cli.output import fail
from gateway.data_dir import DataDirBusy, DataDirLock, private_files
from gateway.policy import PolicyError, load_policy_file
from gateway.settings import Settings, ensure_secrets


def add_serve_parser(commands: Any) -> None:
    serve_parser = commands.add_parser("serve", help="run the gateway")
    serve_parser.add_argument("--workers", type=int, default=1)


def serve_command(settings: Settings, args: argparse.Namespace) -> int:
    return serve(settings, args.workers)


class StartRefused(Exception):
    """Why the gateway will not start, said in one line."""


def check_policy(settings: Settings) -> None:
    try:
        load_policy_file(settings.policy_source)
    except PolicyError as exc:
        raise StartRefused(f"policy {settings.policy_source}: {exc}") from None


def lock_data_dir(settings: Settings) -> DataDirLock:
    """DATA_DIR's lock, held: exclusive with the embedded Redis (one owner of its AOF), shared
    with an external one."""
    lock = DataDirLock(settings.data_dir)
    try:
        lock.acquire(exclusive=settings.embedded_redis)
    except DataDirBusy as exc:
        raise StartRefused(str(exc)) from None
    return lock


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything starts: a busy port fails at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class _RefusedStartFilter(logging.Filter):
    """A start refused with a reason (``app.state.startup_error``) is said in one line, not
    with the traceback uvicorn would print for it."""

    def __init__(self, app: Any) -> None:
        super().__init__()
        self._app = app

    def filter(self, record: logging.LogRecord) -> bool:
        refused = self._app.state.startup_error is not None
        return not (refused and str(record.msg).startswith("Traceback"))


def _take_stop_signals_quietly() -> None:
    """SIGINT (Ctrl-C) and SIGTERM stop the gateway cleanly, exit status 0.

    uvicorn handles them while it runs (the drain), then restores the handlers it found and
    raises the signal again: with Python's defaults that is a KeyboardInterrupt traceback, or a
    death by SIGTERM that `make run` reports as ``*** [run] Terminated``. These handlers, the
    ones it finds and restores, take that second delivery and do nothing."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)


def serve(settings: Settings, workers: int) -> int:
    """Run the gateway, after the checks the module docstring lists; the exit status."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from gateway.app import create_app
    from gateway.logs import configure_process_logging
    from gateway.server.http_guard import guarded_protocol
    from gateway.server.proxies import proxy_options

    configure_process_logging(settings.log_level, settings.log_format)
    try:
        check_policy(settings)
        if workers > 1 and settings.embedded_redis:
            raise StartRefused("--workers > 1 needs SWITCHYARD_REDIS_URL (one shared Redis)")
        lock = lock_data_dir(settings)
    except StartRefused as exc:
        return fail(str(exc))
    with lock:
        private_files(settings.data_dir)  # files written before DATA_DIR was kept private
        secrets = ensure_secrets(settings)
        if settings.admin_key is not None:
            print("Admin key: (from SWITCHYARD_ADMIN_KEY)", flush=True)
        elif secrets.admin_key_generated:  # shown once, like an API key
            print(f"Admin key (generated now): {secrets.admin_key}", flush=True)
            print(f"  stored in {settings.data_dir / 'admin_key'} (mode 0600)", flush=True)
        else:
            print(f"Admin key: in {settings.data_dir / 'admin_key'}", flush=True)
        try:
            sock = _listen(settings.host, settings.port)
        except OSError as exc:
            return fail(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror}")
        if settings.policy_fallback is not None:
            print(
                f"Policy: no {settings.policy_file} here, serving the shipped default"
                f" ({settings.policy_fallback}); `switchyard init` writes an editable copy",
                flush=True,
            )
        redis_note = settings.redis_url or f"embedded, data in {settings.redis_dir}"
        print(
            f"Switchyard on http://{settings.host}:{settings.port} (Redis: {redis_note})",
            flush=True,
        )
        options: dict[str, Any] = {
            "loop": "uvloop",
            "access_log": False,
            "log_level": "warning",
            # Each worker's own app: no on_reject hook.
            "http": guarded_protocol(settings.http_guard),
            "timeout_keep_alive": settings.keep_alive_timeout_s,
            # SIGTERM drains in the app first (shutdown_grace_s); this only bounds what is left.
            "timeout_graceful_shutdown": 2,
            **proxy_options(settings),
        }
        with sock:
            if workers > 1:
                config = uvicorn.Config(
                    "gateway.app:create_app_from_env", factory=True, workers=workers, **options
                )
                Multiprocess(config, sockets=[sock]).run()
                return 0
            app = create_app(settings)
            options["http"] = guarded_protocol(settings.http_guard, app.state.record_wire_rejection)
            server = uvicorn.Server(uvicorn.Config(app, **options))
            logging.getLogger("uvicorn.error").addFilter(_RefusedStartFilter(app))
            _take_stop_signals_quietly()
            try:
                server.run(sockets=[sock])
            except SystemExit:
                if server.started:
                    raise
            if not server.started:
                reason = app.state.startup_error or "see the log above"
                return fail(f"the gateway did not start: {reason}", 3)
    return 0
