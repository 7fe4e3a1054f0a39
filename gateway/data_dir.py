"""What a gateway keeps under DATA_DIR is private to it: modes, and one owner at a time.

- ``private_dir`` makes a directory (parents too) with mode 0700 and tightens one that exists:
  DATA_DIR, the embedded Redis's directory, the usage spool and the models directory hold keys,
  usage and secrets. Files in them are written 0600: the ``switchyard`` commands that use
  DATA_DIR run with umask 077 (``PRIVATE_UMASK``; so do the embedded Redis and the engine, its
  children), which covers files that libraries create on their own (SQLite's -wal and -shm,
  Redis's AOF, the engine's model views); ``serve`` tightens data written before this rule.
- ``DataDirLock`` is an ``flock`` on ``DATA_DIR/serve.lock`` holding the owner's pid. A gateway
  with the embedded Redis takes it exclusively: a second one on the same DATA_DIR would start a
  second Redis on the same AOF files, so it stops at once, naming the first's pid. Gateways on an
  external Redis take it shared (their spool is safe to share) and still keep an embedded one
  out. The kernel drops the lock when its holder dies, so a crash never leaves it stale.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_NAME = "serve.lock"
PRIVATE_DIR_MODE = 0o700
PRIVATE_UMASK = 0o077  # new files 0600, new folders 0700


def private_dir(path: Path) -> bool:
    """Create ``path`` (mode 0700) or tighten it; False if it exists, is not ours, and stays
    open to others (a mounted volume, say)."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    try:
        os.chmod(path, PRIVATE_DIR_MODE)
    except PermissionError:
        return (path.stat().st_mode & 0o077) == 0
    return True


def private_files(directory: Path) -> None:
    """Files under ``directory`` made 0600 and folders 0700 (data written before this rule)."""
    for root, folders, files in os.walk(directory):
        for name in folders:
            full = os.path.join(root, name)
            with contextlib.suppress(OSError):
                if not os.path.islink(full):  # a link's target is not ours to change
                    os.chmod(full, PRIVATE_DIR_MODE)
        for name in files:
            full = os.path.join(root, name)
            with contextlib.suppress(OSError):
                if not os.path.islink(full):
                    os.chmod(full, 0o600)


class DataDirBusy(RuntimeError):
    """Another gateway process owns the data directory."""


class DataDirLock:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self, *, exclusive: bool) -> None:
        """Take the lock now or raise ``DataDirBusy`` naming the holder's pid; never waits."""
        private_dir(self.data_dir)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            owner = f"pid {holder}" if holder.isdigit() else "another process"
            raise DataDirBusy(
                f"{self.data_dir.resolve()} is in use by another switchyard process ({owner});"
                " stop it first, or give this one its own SWITCHYARD_DATA_DIR"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
