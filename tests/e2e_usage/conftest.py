"""Fixtures for the usage end-to-end proofs: the counting provider and its policy file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

# pytest's default import mode puts this folder on sys.path: the ledger_* helpers import by name.
from ledger_provider import CountingProvider, ThreadedCountingProvider
from ledger_support import policy_yaml


@pytest.fixture
def provider() -> Iterator[CountingProvider]:
    """A fresh provider per test, so its books hold only that test's requests."""
    with ThreadedCountingProvider() as counting:
        yield counting


@pytest.fixture
def policy_file(tmp_path: Path, provider: CountingProvider) -> Path:
    path = tmp_path / "routing_rules.yaml"
    path.write_text(policy_yaml(provider.base_url))
    return path
