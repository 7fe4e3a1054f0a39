"""Whether a model of the policy can be served here now, for ``GET /v1/models``.

A model is ``available`` when its own provider can take a request: its ``api_key_env`` is set
and, for a local engine or a fleet, it is loaded and healthy (busy or a breaker open still
counts as available: those pass). An unavailable one says why (``unavailable_reason``:
``OPENAI_API_KEY is not set``), and, when a request pinned to it would still be answered by
one of its fallbacks, which model that would be (``answered_by``): offline, the shipped
``cheap`` is answered by the local model.
"""

from __future__ import annotations

from typing import Annotated, NotRequired, TypedDict

import msgspec

from gateway.policy import Policy
from gateway.routing.dispatch import Dispatcher


class Availability(TypedDict):
    available: Annotated[bool, msgspec.Meta(description="its provider can serve it now")]
    unavailable_reason: NotRequired[
        Annotated[str, msgspec.Meta(description="why not (a key not set...)")]
    ]
    answered_by: NotRequired[
        Annotated[str, msgspec.Meta(description="the fallback that would answer instead")]
    ]


def _reason(model: str, policy: Policy, dispatcher: Dispatcher) -> str | None:
    provider = policy.models[model].provider
    return dispatcher.not_servable(provider, policy.providers[provider])


def availability(
    model: str, policy: Policy, dispatcher: Dispatcher, allowed: frozenset[str] | None = None
) -> Availability:
    """``{"available": true}``, or false with the reason and the fallback that would answer
    (among the ``allowed`` models of the caller's key: routing never goes past those)."""
    reason = _reason(model, policy, dispatcher)
    if reason is None:
        return {"available": True}
    fields: Availability = {"available": False, "unavailable_reason": reason}
    seen, queue = {model}, policy.model_fallbacks(model)
    while queue:  # the dispatcher's order: direct fallbacks first, then theirs
        candidate = queue.pop(0)
        if candidate in seen or (allowed is not None and candidate not in allowed):
            continue
        seen.add(candidate)
        if _reason(candidate, policy, dispatcher) is None:
            fields["answered_by"] = candidate
            break
        queue.extend(policy.model_fallbacks(candidate))
    return fields
