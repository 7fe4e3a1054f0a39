"""Fixtures for the metering proofs over running gateways: the counting provider and its
policy file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from counting_provider import CountingProvider
from loopback import ServedOnThread
from usage_workload import policy_yaml


@pytest.fixture
def provider() -> Iterator[CountingProvider]:
    """A fresh provider per test, so its books hold only that test's requests."""
    with ServedOnThread(CountingProvider()) as counting:
        yield counting


@pytest.fixture
def counting_policy(tmp_path: Path, provider: CountingProvider) -> Path:
    path = tmp_path / "routing_rules.yaml"
    path.write_text(policy_yaml(provider.base_url))
    return path
