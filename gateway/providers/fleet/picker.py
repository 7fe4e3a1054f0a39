"""Which replica takes a request: the routing strategy over the replicas that can take one now.

A replica is eligible unless it is ejected (health), past its ``spill_when`` thresholds (its
scraped queue or KV cache use, as the local engine spills: ``waiting > spill.waiting`` or
``kv_usage > spill.kv_usage``), or excluded for this request (it already failed it). Among the
eligible ones:

- ``affinity``: first the replica that took the longest run of this prompt's leading blocks
  (``PrefixMemory``), then the first block's preference order on the consistent-hash ring,
  under bounded load (``affinity.py``); load = requests in flight from this gateway + the
  replica's scraped waiting queue;
- ``least_loaded``: the lowest load, ties broken by the first block's ring order (or URL order);
- ``round_robin``: each eligible replica in turn, in URL order (the baseline).

The ring is built over every active replica, eligible or not, so a replica's short ejection
does not move the keys of the others. ``pick`` returns None only when no replica is eligible.
It is deterministic: the same replicas, loads, prompts and history give the same picks.
``commit=False`` (an explain) leaves the memory and the round-robin turn as they were.
``honor_spill=False`` picks as if no replica were past ``spill_when``: a fleet tried as the last
resort (every other candidate failed) queues on its replicas, as the local engine does.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass, field, replace
from typing import Literal

from gateway.policy import SpillWhen
from gateway.providers.fleet.affinity import HashRing, PrefixMemory, bounded_capacity
from gateway.providers.fleet.explain import Reason, ReplicaCandidate, RoutePick, Verdict
from gateway.providers.fleet.members import Replica
from gateway.providers.fleet.scrape import ReplicaLoad

Routing = Literal["affinity", "round_robin", "least_loaded"]
ROUTINGS: tuple[Routing, ...] = ("affinity", "round_robin", "least_loaded")
# Why the home replica was passed over -> the pick's reason.
_REASON_OF_SKIP: dict[Verdict, Reason] = {
    "full": "load",
    "spill": "spill",
    "ejected": "ejected-skip",
    "excluded": "failover",
}


def past_spill(spill: SpillWhen, load: ReplicaLoad | None) -> str | None:
    """Why a replica with ``load`` is past the policy's ``spill_when`` (a replica busier than
    that takes no new request; None = no limit on that measure), or None."""
    if load is None:
        return None
    if spill.waiting is not None and load.waiting > spill.waiting:
        return f"waiting {load.waiting} > {spill.waiting}"
    kv = load.kv_usage
    if spill.kv_usage is not None and kv is not None and kv > spill.kv_usage:
        return f"kv usage {kv:.2f} > {spill.kv_usage}"
    return None


@dataclass(frozen=True)
class PickSettings:
    routing: Routing = "affinity"
    load_factor: float = 0.25  # epsilon of the bounded loads: capacity = (1 + eps) * mean
    virtual_nodes: int = 100
    memory_entries: int = 65536  # block hashes remembered (affinity); 0 = ring and load only
    spill: SpillWhen = field(default_factory=SpillWhen)

    def __post_init__(self) -> None:
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, not {self.routing!r}")
        if not self.load_factor > 0:
            raise ValueError(f"load_factor must be > 0, not {self.load_factor}")
        if self.virtual_nodes < 1:
            raise ValueError(f"virtual_nodes must be >= 1, not {self.virtual_nodes}")
        if self.memory_entries < 0:
            raise ValueError(f"memory_entries must be >= 0, not {self.memory_entries}")


class Picker:
    """Holds the ring (rebuilt when the replica set changes), the prefix memory and the
    round-robin turn."""

    def __init__(self, settings: PickSettings) -> None:
        self.settings = settings
        self.memory = PrefixMemory(settings.memory_entries)
        self._ring: HashRing | None = None
        self._turn = 0

    def ring(self, urls: Set[str]) -> HashRing:
        if self._ring is None or self._ring.members != urls:
            self._ring = HashRing(urls, self.settings.virtual_nodes)
        return self._ring

    def _verdict(
        self, replica: Replica, exclude: Set[str], honor_spill: bool
    ) -> tuple[Verdict, str | None] | None:
        """Why ``replica`` cannot take this request, or None when it can."""
        if replica.url in exclude:
            return "excluded", None
        if replica.draining:
            return "draining", None
        if not replica.health.usable:
            return "ejected", replica.health.last_error
        if not honor_spill:
            return None
        spill = past_spill(self.settings.spill, replica.load)
        if spill is not None:
            return "spill", spill
        return None

    def pick(
        self,
        replicas: Sequence[Replica],
        hashes: Sequence[int] | None,
        exclude: Set[str] = frozenset(),
        *,
        commit: bool = True,
        honor_spill: bool = True,
    ) -> RoutePick | None:
        """The replica for a request with these prefix block hashes (see the module docstring)."""
        verdicts = {
            replica.url: self._verdict(replica, exclude, honor_spill) for replica in replicas
        }
        if all(verdict is not None for verdict in verdicts.values()):
            return None
        routing = self.settings.routing
        if routing == "round_robin":
            pick = self._round_robin(replicas, verdicts, commit)
        else:
            key = hashes[0] if hashes else None
            order = self._order(replicas, key)
            if routing == "least_loaded" or not hashes:
                pick = self._least_loaded(order, verdicts, key)
            else:
                pick = self._bounded(order, verdicts, hashes, commit)
        return self._after_failure(pick, replicas, exclude)

    @staticmethod
    def _after_failure(
        pick: RoutePick, replicas: Sequence[Replica], exclude: Set[str]
    ) -> RoutePick:
        """A request another replica failed is a failover whatever led to this replica; the
        replicas that failed it are listed first."""
        failed = [replica for replica in replicas if replica.url in exclude]
        if not failed:
            return pick
        listed = {candidate.replica for candidate in pick.candidates}
        missing = tuple(
            ReplicaCandidate(replica.url, replica.load_units, "excluded")
            for replica in failed
            if replica.url not in listed
        )
        return replace(pick, reason="failover", candidates=(*missing, *pick.candidates))

    def _order(self, replicas: Sequence[Replica], key: int | None) -> list[Replica]:
        by_url = {replica.url: replica for replica in replicas}
        if key is None:
            return [by_url[url] for url in sorted(by_url)]
        return [by_url[url] for url in self.ring(by_url.keys()).walk(key)]

    def _bounded(
        self,
        order: list[Replica],
        verdicts: dict[str, tuple[Verdict, str | None] | None],
        hashes: Sequence[int],
        commit: bool,
    ) -> RoutePick:
        by_url = {replica.url: replica for replica in order}
        remembered = self.memory.longest(hashes, by_url)
        if remembered is not None:  # the replica holding the longest run goes first
            first = by_url[remembered[0]]
            order = [first, *(replica for replica in order if replica is not first)]
        eligible = [replica for replica in order if verdicts[replica.url] is None]
        total = sum(replica.load_units for replica in eligible)
        capacity = bounded_capacity(total, len(eligible), self.settings.load_factor)
        passed: list[ReplicaCandidate] = []
        for replica in order:
            verdict = verdicts[replica.url]
            if verdict is None and replica.load_units < capacity:
                if commit:
                    self.memory.remember(hashes, replica.url)
                chosen = ReplicaCandidate(replica.url, replica.load_units, "chosen")
                matched = remembered[1] if remembered and remembered[0] == replica.url else 0
                return RoutePick(
                    replica.url,
                    _REASON_OF_SKIP[passed[0].verdict] if passed else "affinity",
                    "affinity",
                    (*passed, chosen),
                    key=hashes[0],
                    capacity=capacity,
                    matched_blocks=matched,
                )
            if verdict is None:
                verdict = ("full", f"load {replica.load_units} >= capacity {capacity}")
            passed.append(ReplicaCandidate(replica.url, replica.load_units, *verdict))
        raise AssertionError("bounded load: the least loaded eligible replica is below capacity")

    def _least_loaded(
        self,
        order: list[Replica],
        verdicts: dict[str, tuple[Verdict, str | None] | None],
        key: int | None,
    ) -> RoutePick:
        eligible = [replica for replica in order if verdicts[replica.url] is None]
        best = min(eligible, key=lambda replica: replica.load_units)  # first in order on ties
        candidates = []
        for replica in order:
            verdict = verdicts[replica.url]
            if replica is best:
                verdict = ("chosen", None)
            elif verdict is None:
                verdict = ("busier", f"load {replica.load_units} vs {best.load_units}")
            candidates.append(ReplicaCandidate(replica.url, replica.load_units, *verdict))
        return RoutePick(best.url, "load", "least_loaded", tuple(candidates), key)

    def _round_robin(
        self,
        replicas: Sequence[Replica],
        verdicts: dict[str, tuple[Verdict, str | None] | None],
        commit: bool,
    ) -> RoutePick:
        ordered = sorted(replicas, key=lambda replica: replica.url)
        eligible = [replica for replica in ordered if verdicts[replica.url] is None]
        chosen = eligible[self._turn % len(eligible)]
        if commit:
            self._turn += 1
        candidates = []
        for replica in ordered:
            verdict = ("chosen", None) if replica is chosen else verdicts[replica.url]
            if verdict is not None:  # eligible replicas out of turn are not listed
                candidates.append(ReplicaCandidate(replica.url, replica.load_units, *verdict))
        return RoutePick(chosen.url, "round_robin", "round_robin", tuple(candidates))
