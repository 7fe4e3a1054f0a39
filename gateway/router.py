"""Request + policy -> ordered candidates, each with the reason it is there."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import InvalidRequest, NotFound, PermissionDenied
from gateway.policy_store import PolicyStore


@dataclass(frozen=True)
class Candidate:
    model: str
    provider: str
    upstream_model: str
    reason: str


@dataclass(frozen=True)
class RoutePlan:
    task: str | None
    strategy: str
    candidates: list[Candidate]
    policy_version: str
    notes: list[str] = field(default_factory=list)

    def header_value(self, served: Candidate) -> str:
        """The ``x-switchyard-route`` header: task, strategy and why this candidate."""
        return f"task={self.task or '-'}; strategy={self.strategy}; reason={served.reason}"


class Router:
    def __init__(self, policies: PolicyStore) -> None:
        self.policies = policies

    def plan(
        self,
        *,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        key_id: str,
        allowed_models: frozenset[str] | None,
    ) -> RoutePlan:
        loaded = self.policies.current
        policy = loaded.policy
        requested = body.get("model")
        if not isinstance(requested, str) or not requested:
            raise InvalidRequest("you must provide a model parameter", param="model")
        model = policy.resolve_model(requested)
        if model is None:
            raise NotFound(
                f"The model `{requested}` does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )
        if allowed_models is not None and model not in allowed_models:
            raise PermissionDenied(
                f"this key may not use the model `{requested}`",
                param="model",
                code="model_not_allowed",
            )
        config = policy.models[model]
        reason = "pinned" if requested == model else f"pinned via alias {requested}"
        candidate = Candidate(model, config.provider, policy.upstream_model(model), reason)
        return RoutePlan(None, "pinned", [candidate], loaded.version)
