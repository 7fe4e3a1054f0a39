"""A throwaway PostgreSQL server in a temp dir, for the test suite and the ledger benchmark.

``ScratchPostgres`` runs ``initdb`` and ``pg_ctl`` (Debian's ``postgresql`` package: they live
under ``/usr/lib/postgresql/<version>/bin`` when not on PATH) on a free TCP port on 127.0.0.1,
with its unix socket in the same temp dir, trust authentication and superuser ``switchyard``.
``initdb`` refuses to run as root, so under root the server runs as the ``postgres`` OS user
(or ``nobody``) and the temp dir is handed to that user. ``stop`` removes everything.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from ports import free_port

SUPERUSER = "switchyard"
DATABASE = "postgres"


class ScratchPostgresError(RuntimeError):
    """The scratch server could not be set up; the message says what to install or fix."""


def postgres_bin_dir() -> Path:
    """The folder holding initdb and pg_ctl: PATH first, else the newest Debian install."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda path: int(path.parent.parent.name) if path.parent.parent.name.isdigit() else 0,
    )
    if not candidates:
        raise ScratchPostgresError(
            "no initdb found: install PostgreSQL (Debian: apt-get install postgresql)"
        )
    return candidates[-1].parent


def _server_account() -> tuple[int, int] | None:
    """(uid, gid) to run the server as when we are root; None when we may run it ourselves."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            return entry.pw_uid, entry.pw_gid
    raise ScratchPostgresError("running as root and no 'postgres' or 'nobody' user to run as")


class ScratchPostgres:
    """One PostgreSQL server for as long as the object lives between ``start`` and ``stop``.

    ``durable=False`` (tests) turns off fsync and full-page writes; the benchmark keeps them on
    so its figures are those of a real server.
    """

    def __init__(
        self, *, durable: bool = False, base_dir: Path | None = None, shared_buffers: str = "64MB"
    ) -> None:
        self.durable = durable
        self.shared_buffers = shared_buffers
        self.base_dir = base_dir
        self.port = 0
        self.root: Path | None = None
        self._account = _server_account()
        self._bin = postgres_bin_dir()

    @property
    def url(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{DATABASE}"

    def url_for(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    @property
    def _data(self) -> Path:
        assert self.root is not None
        return self.root / "data"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        user: int | None = None
        group: int | None = None
        if self._account is not None:
            user, group = self._account
        return subprocess.run(
            args,
            user=user,
            group=group,
            extra_groups=[] if self._account is not None else None,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"},
            cwd="/",
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def start(self) -> ScratchPostgres:
        self.root = Path(tempfile.mkdtemp(prefix="sy-pg-", dir=self.base_dir))
        # mkdtemp's dir under /tmp is reachable by other users; hand it to the server's user.
        if self._account is not None:
            os.chown(self.root, *self._account)
        self.root.chmod(0o700)
        init = self._run(
            str(self._bin / "initdb"),
            "-D",
            str(self._data),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )
        if init.returncode != 0:
            self._cleanup()
            raise ScratchPostgresError(f"initdb failed: {init.stderr.strip()[-2000:]}")
        self.port = free_port()
        options = [
            f"-p {self.port}",
            "-c listen_addresses=127.0.0.1",
            f"-c unix_socket_directories={self.root}",
            "-c max_connections=60",
            f"-c shared_buffers={self.shared_buffers}",
        ]
        if not self.durable:
            options += ["-c fsync=off", "-c full_page_writes=off", "-c synchronous_commit=off"]
        started = self._run(
            str(self._bin / "pg_ctl"),
            "start",
            "-w",
            "-t",
            "60",
            "-D",
            str(self._data),
            "-l",
            str(self.root / "server.log"),
            "-o",
            " ".join(options),
        )
        if started.returncode != 0:
            log = self._log_tail()
            self._cleanup()
            raise ScratchPostgresError(f"pg_ctl start failed: {started.stderr.strip()} {log}")
        return self

    def _log_tail(self) -> str:
        assert self.root is not None
        with contextlib.suppress(OSError):
            return (self.root / "server.log").read_text()[-2000:]
        return ""

    def stop(self) -> None:
        if self.root is None:
            return
        if (self._data / "postmaster.pid").exists():
            self._run(str(self._bin / "pg_ctl"), "stop", "-w", "-m", "fast", "-D", str(self._data))
        self._cleanup()

    def _cleanup(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> ScratchPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
