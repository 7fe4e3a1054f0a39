"""``Candidate``: one model of the policy that a request may go to, and why.

The router makes them (a plan is candidates in the order they are tried); the dispatcher, the
provider-side attempts and the cache key read them. It sits with the policy, below all of
them, because it is only the policy's names for one model and its provider.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    model: str
    provider: str
    upstream_model: str
    reason: str
    # Served here because a local engine before it was past its spill_when thresholds.
    spilled: bool = False
    context_window: int | None = None  # the policy's, in tokens (None: not said)
