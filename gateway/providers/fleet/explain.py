"""The record of one pick: which replica, why, and what else was looked at.

``reason`` is one of:

- ``affinity``: the replica that holds the prompt's longest remembered prefix took it, or, for
  a prefix not seen before, its first block's home on the ring;
- ``load``: the home replica (or every replica, for ``least_loaded``) was fuller than another;
- ``spill``: the home replica was past ``spill_when`` (queue or KV cache);
- ``ejected-skip``: the home replica is ejected (unreachable, waiting for its probe);
- ``failover``: a replica already failed this request (listed ``excluded``), so it is retried
  here;
- ``round_robin``: the next replica in turn.

``candidates`` lists the replicas looked at, each with its load and verdict (``chosen`` for
exactly one): for ``affinity`` those passed over on the ring walk and then the chosen one; for
``least_loaded`` every replica; for ``round_robin`` the chosen one and those skipped as unable
to serve. An operator reading ``/admin/route/explain`` so sees why each was passed over.
``header_part()`` is the short form for ``x-switchyard-route``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

Reason = Literal["affinity", "load", "spill", "ejected-skip", "failover", "round_robin"]
Verdict = Literal["chosen", "full", "busier", "spill", "ejected", "excluded", "draining"]


def replica_label(url: str) -> str:
    """``host:port`` of a replica URL (never any credentials a URL might carry)."""
    parts = urlsplit(url)
    return parts.netloc.rpartition("@")[2] or url


@dataclass(frozen=True)
class ReplicaCandidate:
    """A replica as a pick saw it: its load, and why it was chosen, passed over or excluded."""

    replica: str
    load: int  # in flight from this gateway + the replica's scraped waiting queue
    verdict: Verdict
    detail: str | None = None  # e.g. "waiting 12 > 8", "load 9 >= capacity 8"

    def as_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "replica": replica_label(self.replica),
            "load": self.load,
            "verdict": self.verdict,
        }
        if self.detail is not None:
            entry["detail"] = self.detail
        return entry


@dataclass(frozen=True)
class RoutePick:
    replica: str  # the chosen replica's base URL
    reason: Reason
    routing: str  # affinity | round_robin | least_loaded
    candidates: tuple[ReplicaCandidate, ...]
    key: int | None = None  # the first block's hash: the ring position (affinity)
    capacity: int | None = None  # the bounded-load cap in force (affinity)
    matched_blocks: int = 0  # leading blocks remembered on the chosen replica (affinity)

    @property
    def label(self) -> str:
        return replica_label(self.replica)

    def header_part(self) -> str:
        """``replica=10.0.0.5:8000 (affinity)``: one part of ``x-switchyard-route``."""
        return f"replica={self.label} ({self.reason})"

    def as_dict(self) -> dict[str, Any]:
        """The JSON for ``/admin/route/explain``."""
        return {
            "replica": self.label,
            "reason": self.reason,
            "routing": self.routing,
            "prefix_key": None if self.key is None else f"{self.key:016x}",
            "capacity": self.capacity,
            "matched_blocks": self.matched_blocks,
            "candidates": [candidate.as_dict() for candidate in self.candidates],
        }
