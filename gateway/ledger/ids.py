"""Event ids that begin with their time: UUIDv7 (RFC 9562), written as 32 hex digits.

The usage store keeps each day's events under a unique index on ``(day, event_id)``, and the
audit log under one on ``event_id``. A random id lands on a random page of that index: once a
day's index outgrows the page cache, every insert reads a page back and writes it out again
(SQLite's WAL, PostgreSQL's B-tree). An id that begins with its millisecond lands at the
index's end, where the last insert left the page warm. ``python -m bench.ledger --growth``
times both as a day's table fills (docs/usage.md).

The time is the id's creation, not the event's; 74 random bits keep ids made in the same
millisecond apart (and unguessable: a usage id is not a secret, but nobody can name one in
advance).
"""

from __future__ import annotations

import os
import time

_RANDOM_A = (1 << 12) - 1
_RANDOM_B = (1 << 62) - 1


def time_ordered_id() -> str:
    """A new UUIDv7: 48 bits of Unix milliseconds, version 7, 74 random bits, variant 10."""
    millis = time.time_ns() // 1_000_000
    noise = int.from_bytes(os.urandom(10), "big")
    value = (
        (millis & 0xFFFF_FFFF_FFFF) << 80
        | 0x7 << 76
        | (noise >> 62 & _RANDOM_A) << 64
        | 0x2 << 62
        | noise & _RANDOM_B
    )
    return f"{value:032x}"
