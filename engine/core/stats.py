"""Engine metrics, under vLLM's names where vLLM has one.

The step thread pushes counters and gauges after every step, and the output processor
(wherever it runs) pushes the latencies it observes once per step; readers (the gateway's load-aware
routing, /metrics, tests) call `snapshot()`, which is safe from any thread.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StepRecord:
    """What one engine step computed: shows continuous batching (prefills mixed with decodes)."""

    step: int
    num_prefill_seqs: int
    num_decode_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    request_ids: tuple[str, ...]


def _summary(values: deque[float]) -> dict[str, float]:
    if not values:
        return {"count": 0, "mean": 0.0, "p50": 0.0, "p99": 0.0}
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "mean": sum(ordered) / len(ordered),
        "p50": ordered[len(ordered) // 2],
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
    }


class EngineStats:
    def __init__(self, history: int = 4096) -> None:
        self._lock = threading.Lock()
        self.num_requests_running = 0
        self.num_requests_waiting = 0
        self.kv_cache_usage_perc = 0.0  # a ratio in [0, 1], as in vLLM
        self.kv_cache_waste_ratio = 0.0  # (allocated slots - used tokens) / used tokens
        self.kv_cache_waste_slots_per_seq = 0.0
        self.prefix_cache_hits = 0  # tokens
        self.prefix_cache_queries = 0  # tokens
        self.num_preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_requests_finished = 0
        self.num_steps = 0
        self.time_to_first_token_seconds: deque[float] = deque(maxlen=history)
        self.inter_token_latency_seconds: deque[float] = deque(maxlen=history)
        self.e2e_request_latency_seconds: deque[float] = deque(maxlen=history)
        self.steps: deque[StepRecord] = deque(maxlen=history)

    def record_step(self, record: StepRecord) -> None:
        with self._lock:
            self.num_steps += 1
            self.steps.append(record)

    def record_gauges(
        self,
        running: int,
        waiting: int,
        kv_usage: float,
        allocated_slots: int,
        used_tokens: int,
        prefix_hits: int,
        prefix_queries: int,
    ) -> None:
        with self._lock:
            self.num_requests_running = running
            self.num_requests_waiting = waiting
            self.kv_cache_usage_perc = kv_usage
            wasted = max(allocated_slots - used_tokens, 0)
            self.kv_cache_waste_ratio = wasted / used_tokens if used_tokens else 0.0
            self.kv_cache_waste_slots_per_seq = wasted / running if running else 0.0
            self.prefix_cache_hits = prefix_hits
            self.prefix_cache_queries = prefix_queries

    def record_preemption(self) -> None:
        with self._lock:
            self.num_preemptions += 1

    def record_tokens(self, prompt: int, generated: int) -> None:
        with self._lock:
            self.prompt_tokens_total += prompt
            self.generation_tokens_total += generated

    def record_latencies(
        self, first_token: list[float], inter_token: list[float], finished: list[float]
    ) -> None:
        """One step's worth of TTFT and inter-token samples, and the requests it finished."""
        with self._lock:
            self.time_to_first_token_seconds.extend(first_token)
            self.inter_token_latency_seconds.extend(inter_token)
            self.e2e_request_latency_seconds.extend(finished)
            self.num_requests_finished += len(finished)

    def snapshot(self) -> dict[str, Any]:
        """Every counter and gauge (the numbers `__init__` sets), the prefix cache's hit rate
        and the latency summaries."""
        with self._lock:
            snap: dict[str, Any] = {
                name: value for name, value in vars(self).items() if isinstance(value, (int, float))
            }
            queries = self.prefix_cache_queries
            snap["prefix_cache_hit_rate"] = self.prefix_cache_hits / queries if queries else 0.0
            snap.update(
                time_to_first_token_seconds=_summary(self.time_to_first_token_seconds),
                inter_token_latency_seconds=_summary(self.inter_token_latency_seconds),
                e2e_request_latency_seconds=_summary(self.e2e_request_latency_seconds),
            )
            return snap

    def step_history(self) -> list[StepRecord]:
        with self._lock:
            return list(self.steps)
