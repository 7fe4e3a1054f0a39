"""Sticky canary buckets: a user always lands on the same side of a canary.

The bucket is a hash of (canary source model, user) in [0, 10000); the user is on the canary
when bucket < percent × 100. Raising the percent only moves the threshold up, so everyone who
was already on the canary stays there through 5 → 20 → 50 → 100 %.
"""

from __future__ import annotations

import hashlib

BUCKETS = 10_000


def canary_bucket(source_model: str, user: str) -> int:
    digest = hashlib.sha256(f"{source_model}\x00{user}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def in_canary(bucket: int, percent: float) -> bool:
    return bucket < round(percent * BUCKETS / 100)
