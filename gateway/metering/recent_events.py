"""The events this process appended to the usage buffer, kept until its exporter reads them back.

The exporter turns each buffer entry's JSON back into a checked ``UsageEvent``: about 10 µs an
event on the event loop, most of it the event's construction and field checks, the largest part
of an export round's work there. An entry this process wrote holds exactly the JSON of an event
it already has (``UsageEvent.from_json(event.to_json()) == event``), so the exporter takes that
event by the entry's bytes instead of decoding them; anything else (another replica's entry,
one appended before this process started, an entry past the bound) is decoded as before. Keyed
by the payload itself, a hit can only be the event whose JSON the entry is.

Bounded, oldest first out: entries the exporter never reads back here (another replica's
exporter took them, or the append failed and the event went to the spool) must not accumulate.
"""

from __future__ import annotations

from collections import OrderedDict

from gateway.ledger import UsageEvent

# About 10 MB at most (an entry is ~0.5 KB of JSON and ~0.5 KB of event); the exporter reads
# a round of up to 1,000 events every half second, so the bound is met only when it lags.
CAPACITY = 10_000


class RecentEvents:
    """Payload -> event of the entries this process appended and its exporter has not read."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._events: OrderedDict[bytes, UsageEvent] = OrderedDict()

    def __len__(self) -> int:
        return len(self._events)

    def remember(self, payload: bytes, event: UsageEvent) -> None:
        events = self._events
        events[payload] = event
        if len(events) > self.capacity:
            events.popitem(last=False)

    def take(self, payload: bytes) -> UsageEvent | None:
        """The event whose JSON ``payload`` is, if this process wrote it (once: it is forgotten)."""
        return self._events.pop(payload, None)
