"""Holds the policy in force, with its version, source and the last load error."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from gateway.policy import Policy, PolicyError, parse_policy, policy_version


@dataclass(frozen=True)
class LoadedPolicy:
    policy: Policy
    version: str
    loaded_at: float
    source: str


class PolicyStore:
    """The app builds one; request handlers read ``current`` (an immutable snapshot)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.last_error: PolicyError | None = None
        self._current: LoadedPolicy | None = None

    @property
    def current(self) -> LoadedPolicy:
        if self._current is None:
            raise RuntimeError("policy not loaded")
        return self._current

    @property
    def policy(self) -> Policy:
        return self.current.policy

    @property
    def loaded(self) -> bool:
        return self._current is not None

    def load(self) -> LoadedPolicy:
        """Load the file; on error keep the policy in force and raise."""
        try:
            text = self.path.read_text()
        except OSError as exc:
            self.last_error = PolicyError("", f"cannot read {self.path}: {exc.strerror}")
            raise self.last_error from exc
        return self.apply_text(text, source=str(self.path))

    def apply_text(self, text: str, source: str) -> LoadedPolicy:
        try:
            policy = parse_policy(text)
        except PolicyError as exc:
            self.last_error = exc
            raise
        self._current = LoadedPolicy(policy, policy_version(text), time.time(), source)
        self.last_error = None
        return self._current
