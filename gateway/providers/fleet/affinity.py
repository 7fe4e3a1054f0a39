"""Where a prefix lives: consistent hashing with bounded loads, and a memory of recent picks.

Consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam, 2018). Each replica
owns ``virtual_nodes`` points on a 64-bit ring; a key's preference order is the
replicas met walking clockwise from the key's point. Adding or removing one replica moves only
the keys next to its points, so the other replicas keep their cached prefixes.

Bounded loads: with ``n`` eligible replicas carrying ``L`` units of load in all, none may carry
more than ``capacity = ceil((1 + load_factor) * (L + 1) / n)`` once the new request lands. The
walk takes the first replica in preference order below capacity: a key stays on its home
replica until that replica is fuller than the average by ``load_factor``, then overflows to the
next replica on its ring path (the same one for every gateway, so the overflow is also
cache-friendly). Some eligible replica is always below capacity (the least loaded carries at
most ``L / n``), so the walk always ends in a pick.

``PrefixMemory`` remembers, for the block hashes of recent requests, which replica took them
(least recently used forgotten past ``max_entries``). A request whose leading blocks match a
remembered run goes first to the replica that holds the longest one: a conversation's next turn
meets its own history, and a prefix the bounded walk moved off a full replica stays where it
went instead of splitting its cache over two replicas request by request. The memory is this
gateway's guess at each replica's cache; a wrong guess costs a cache miss, never an error.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Container, Iterable, Iterator, Sequence

from gateway.providers.fleet.prefix import stable_hash


def bounded_capacity(total_load: int, replicas: int, load_factor: float) -> int:
    """The most load one replica may carry, the new request included."""
    if replicas < 1:
        raise ValueError("no replica to bound the load of")
    return math.ceil((1.0 + load_factor) * (total_load + 1) / replicas)


class HashRing:
    """The ring of a set of replica ids; immutable (build a new one when the set changes)."""

    def __init__(self, members: Iterable[str], virtual_nodes: int) -> None:
        if virtual_nodes < 1:
            raise ValueError(f"virtual_nodes must be >= 1, not {virtual_nodes}")
        self.members = frozenset(members)
        points = sorted(
            (stable_hash(f"{member}#{index}".encode()), member)
            for member in self.members
            for index in range(virtual_nodes)
        )
        self._points = [point for point, _ in points]
        self._owners = [member for _, member in points]

    def walk(self, key: int) -> Iterator[str]:
        """Every member once, in the key's preference order (clockwise from its point)."""
        count = len(self._points)
        if count == 0:
            return
        start = bisect_left(self._points, key)
        seen: set[str] = set()
        for step in range(count):
            owner = self._owners[(start + step) % count]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == len(self.members):
                    return


class PrefixMemory:
    """Block hash -> the replica that last took a request starting with those blocks."""

    def __init__(self, max_entries: int) -> None:
        if max_entries < 0:
            raise ValueError(f"memory max_entries must be >= 0, not {max_entries}")
        self.max_entries = max_entries
        self._where: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._where)

    def longest(self, hashes: Sequence[int], members: Container[str]) -> tuple[str, int] | None:
        """(replica, blocks matched) of the longest remembered run still on a member."""
        for depth in range(len(hashes), 0, -1):
            url = self._where.get(hashes[depth - 1])
            if url is not None and url in members:
                return url, depth
        return None

    def remember(self, hashes: Sequence[int], url: str) -> None:
        if self.max_entries == 0:
            return
        where = self._where
        for block in hashes:
            where[block] = url
            where.move_to_end(block)
        while len(where) > self.max_entries:
            where.popitem(last=False)
