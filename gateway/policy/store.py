"""Holds the policy in force, with its version, source and the last load error.

Requests take ``current`` once and keep that immutable snapshot to the end, so a reload never
changes a request half way. The file is watched by polling (mtime, size, then content hash): an
edit takes effect within a second; an invalid edit is logged with its field path, kept in
``last_error``, and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import orjson
import structlog

from gateway.errors import ServiceUnavailable
from gateway.policy.base import PolicyError
from gateway.policy.bounded_yaml import nesting_depth_exceeds
from gateway.policy.document import Policy
from gateway.policy.headers import masked_policy
from gateway.policy.merge import merge_policy_yaml
from gateway.policy.parse import (
    MAX_POLICY_BYTES,
    MAX_POLICY_DEPTH,
    parse_policy,
    policy_version,
    validate_policy_data,
)
from gateway.server.tasks import cancel_until_done


class PolicyLoadError(TypedDict):
    path: str | None
    message: str


class PolicyState(TypedDict):
    """What ``GET /admin/policy`` shows (``PolicyStore.describe``): the policy in force (null
    before one loads) and the last reload that failed, if any."""

    version: str | None
    loaded_at: float | None
    source: str | None
    path: str
    last_error: PolicyLoadError | None
    policy: dict[str, Any] | None


@dataclass(frozen=True)
class LoadedPolicy:
    policy: Policy
    version: str
    loaded_at: float
    source: str
    text: str = field(default="", repr=False)  # as read or written: GET /admin/policy?format=yaml


@dataclass(frozen=True)
class _FileSignature:
    mtime_ns: int
    size: int


_TOO_DEEP = f"the policy is nested more than {MAX_POLICY_DEPTH} levels deep"


@dataclass(frozen=True)
class PolicyBody:
    """A PUT/validate body: YAML text kept verbatim (comments and all), or JSON data that is
    merged into the file in force when it is stored (``gateway.policy.merge``)."""

    text: str | None = None
    data: dict[str, Any] | None = None

    def parse(self) -> Policy:
        """The policy it says, or PolicyError. CPU-bound: call it from a thread."""
        if self.data is not None:
            return validate_policy_data(self.data)
        return parse_policy(self.text or "")


def policy_body(body: bytes, content_type: str | None) -> PolicyBody:
    """Read a PUT/validate body (YAML or JSON) within the policy's bounds (size, nesting).

    CPU-bound for large bodies: call it from a thread, not on the event loop."""
    if len(body) > MAX_POLICY_BYTES:
        raise PolicyError(
            "", f"the policy is {len(body)} bytes; at most {MAX_POLICY_BYTES} are read"
        )
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError("", "the policy body must be UTF-8 text") from exc
    if "json" in (content_type or "").lower():
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            if str(exc).startswith("depth limit exceeded"):
                raise PolicyError("", _TOO_DEEP) from None
            raise PolicyError("", f"invalid JSON: {exc}") from exc
        if isinstance(data, dict | list) and nesting_depth_exceeds(data, MAX_POLICY_DEPTH):
            raise PolicyError("", _TOO_DEEP)
        validate_policy_data(data)
        return PolicyBody(data=data)
    return PolicyBody(text=text)


class PolicyStore:
    """The app builds one; request handlers read ``current`` (an immutable snapshot)."""

    def __init__(
        self, path: Path | str, *, poll_interval_s: float = 0.5, fallback: Path | None = None
    ) -> None:
        self.path = Path(path)
        # Served while ``path`` is missing (the shipped default); the file, once it appears
        # (``switchyard init``, a PUT), takes over.
        self.fallback = fallback
        self.serving_fallback = False
        self.poll_interval_s = poll_interval_s
        self.last_error: PolicyError | None = None
        self._current: LoadedPolicy | None = None
        self._seen: _FileSignature | None = None
        self._seen_hash: str | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._write_lock = threading.Lock()
        self._log = structlog.get_logger("switchyard.policy")

    @property
    def current(self) -> LoadedPolicy:
        if self._current is None:  # the gateway runs on; every reader answers 503 meanwhile
            raise ServiceUnavailable(
                "no routing policy is loaded (/readyz and the log say why)",
                code="policy_not_loaded",
            )
        return self._current

    @property
    def policy(self) -> Policy:
        return self.current.policy

    @property
    def loaded(self) -> bool:
        return self._current is not None

    def policy_or_none(self) -> Policy | None:
        """The policy in force; None while none has loaded."""
        return self._current.policy if self._current is not None else None

    def load(self) -> LoadedPolicy:
        """Load the file; on error keep the policy in force and raise."""
        if self.fallback is not None and not self.path.exists():
            text = self.fallback.read_text()
            loaded = self.apply_text(text, source=f"{self.fallback} (shipped default)")
            self.serving_fallback = True
            return loaded
        try:
            signature = self._signature()
            text = self.path.read_text()
        except OSError as exc:
            self.last_error = PolicyError("", f"cannot read {self.path}: {exc.strerror}")
            raise self.last_error from exc
        self._seen = signature
        self._seen_hash = policy_version(text)
        return self.apply_text(text, source=str(self.path))

    def apply_text(self, text: str, source: str) -> LoadedPolicy:
        try:
            policy = parse_policy(text)
        except PolicyError as exc:
            self.last_error = exc
            raise
        self._current = LoadedPolicy(policy, policy_version(text), time.time(), source, text)
        self.last_error = None
        self.serving_fallback = False
        return self._current

    def write(self, text: str, *, source: str = "admin api") -> LoadedPolicy:
        """Validate ``text``, replace the file atomically, then apply it.

        Nothing is written when the text is invalid. Blocking file I/O: call it from a thread.
        """
        parse_policy(text)  # raises PolicyError; the policy in force and last_error stay
        with self._write_lock:
            self._atomic_write(text)
            self._seen = self._signature()
            self._seen_hash = policy_version(text)
            return self.apply_text(text, source=source)

    def write_body(self, body: PolicyBody, *, source: str = "admin api") -> LoadedPolicy:
        """Store a PUT body: YAML as sent; JSON merged into the file in force, so that its
        comments and layout stay and only what the JSON changes changes. Call it from a thread."""
        if body.data is None:
            return self.write(body.text or "", source=source)
        with self._write_lock:
            try:
                base = self.path.read_text()
            except OSError:
                base = None
            text = merge_policy_yaml(base, body.data)
            parse_policy(text)
            self._atomic_write(text)
            self._seen = self._signature()
            self._seen_hash = policy_version(text)
            return self.apply_text(text, source=source)

    def _atomic_write(self, text: str) -> None:
        directory = self.path.parent
        fd, temp_name = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=directory)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            if self.path.exists():
                os.chmod(temp_name, self.path.stat().st_mode & 0o777)
            os.replace(temp_name, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp_name)
            raise
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _signature(self) -> _FileSignature:
        stat = self.path.stat()
        return _FileSignature(stat.st_mtime_ns, stat.st_size)

    def poll_once(self) -> bool:
        """Reload when the file changed; True when a new policy was applied."""
        with self._write_lock:
            return self._poll_locked()

    def _poll_locked(self) -> bool:
        try:
            signature = self._signature()
        except OSError as exc:
            if self.serving_fallback and isinstance(exc, FileNotFoundError):
                return False  # no file yet: the shipped default stays
            self._note_error(PolicyError("", f"cannot stat {self.path}: {exc.strerror}"))
            return False
        if signature == self._seen:
            return False
        try:
            text = self.path.read_text()
        except OSError as exc:
            self._note_error(PolicyError("", f"cannot read {self.path}: {exc.strerror}"))
            return False
        self._seen = signature
        digest = policy_version(text)
        if digest == self._seen_hash:
            if self._current is not None and self._current.version == digest:
                self.last_error = None  # e.g. the file came back unchanged after a removal
            return False  # touched, not changed
        self._seen_hash = digest
        try:
            loaded = self.apply_text(text, source=str(self.path))
        except PolicyError as exc:
            self._log.error(
                "policy_reload_rejected", path=exc.path, error=exc.message, file=str(self.path)
            )
            return False
        self._log.info("policy_reloaded", version=loaded.version, file=str(self.path))
        return True

    def _note_error(self, error: PolicyError) -> None:
        if self.last_error is None or str(self.last_error) != str(error):
            self._log.error("policy_reload_failed", error=str(error), file=str(self.path))
        self.last_error = error

    def start_watching(self) -> None:
        """Poll the file in an asyncio task until ``stop()``."""
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            try:
                await asyncio.to_thread(self.poll_once)
            except Exception as exc:  # a watcher that dies silently would freeze the policy
                self._log.error("policy_watch_error", error=repr(exc))

    async def stop(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            await cancel_until_done([watcher])

    def describe(self, *, reveal_headers: bool = False) -> PolicyState:
        """The state shown by ``GET /admin/policy``; providers' header values masked unless
        ``reveal_headers`` (the admin role)."""
        loaded = self._current
        policy = loaded.policy.model_dump(mode="json", by_alias=True) if loaded else None
        if policy is not None and not reveal_headers:
            policy = masked_policy(policy)
        return {
            "version": loaded.version if loaded else None,
            "loaded_at": loaded.loaded_at if loaded else None,
            "source": loaded.source if loaded else None,
            "path": str(self.path),
            "last_error": (
                {"path": self.last_error.path, "message": self.last_error.message}
                if self.last_error
                else None
            ),
            "policy": policy,
        }
