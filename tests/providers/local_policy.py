"""Routing policies for the local-engine tests: ``tiny`` served by the ``home`` provider (the
local engine on the CPU) and, given an upstream, ``up-model`` there and the task ``mixed``
trying ``tiny`` first and the upstream next."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def local_policy(
    model: Path,
    upstream: str | None = None,
    *,
    spill_when: dict[str, Any] | None = None,
    up_price: dict[str, float] | None = None,
    **engine: Any,
) -> str:
    """The policy's YAML: ``home`` loads ``model`` with the ``engine`` settings; ``spill_when``
    is home's, ``up_price`` the upstream model's (neither set when not given)."""
    home: dict[str, Any] = {
        "kind": "local",
        "engine": {"model": str(model), "device": "cpu", **engine},
    }
    if spill_when is not None:
        home["spill_when"] = spill_when
    providers: dict[str, Any] = {"home": home}
    models: dict[str, Any] = {"tiny": {"provider": "home", "upstream_model": "tiny-qwen3"}}
    policy: dict[str, Any] = {"providers": providers, "models": models}
    if upstream is not None:
        providers["up"] = {"base_url": upstream}
        models["up-model"] = {"provider": "up"}
        if up_price is not None:
            models["up-model"]["price"] = up_price
        policy["tasks"] = {"mixed": {"strategy": "ordered", "candidates": ["tiny", "up-model"]}}
    return yaml.safe_dump(policy, sort_keys=False)
