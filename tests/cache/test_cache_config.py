"""The policy's cache block: defaults, strict validation naming the field, precedence."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.policy import CachePolicy, effective_cache


def test_defaults_are_private_deterministic_and_bounded() -> None:
    policy = CachePolicy()
    assert (policy.shared, policy.allow_nondeterministic) == (False, False)
    assert policy.ttl_s == 3600 and policy.max_entry_bytes == 1 << 20
    assert policy.max_entries == 10_000


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ({"ttl_s": 0}, "ttl_s"),
        ({"ttl_s": 31 * 86_400}, "ttl_s"),
        ({"ttl_s": float("inf")}, "ttl_s"),
        ({"max_entry_bytes": 0}, "max_entry_bytes"),
        ({"max_entry_bytes": 65 * 1024 * 1024}, "max_entry_bytes"),
        ({"max_entries": 0}, "max_entries"),
        ({"shared": "maybe"}, "shared"),
        ({"ttl": 60}, "ttl"),
    ],
)
def test_bad_blocks_are_refused_naming_the_field(block: dict, field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        CachePolicy.model_validate(block)
    assert refused.value.errors()[0]["loc"] == (field,)


def test_the_task_block_wins_over_the_model_block() -> None:
    task, model = CachePolicy(ttl_s=60), CachePolicy(ttl_s=600)
    assert effective_cache(task, model) is task
    assert effective_cache(None, model) is model
    assert effective_cache(None, None) is None
