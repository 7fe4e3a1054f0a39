"""Prometheus metrics, one registry per app so that several apps can live in one process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "switchyard_requests_total",
            "Requests by route, model, provider and status.",
            ["route", "model", "provider", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "switchyard_request_duration_seconds",
            "Time from request to the last byte of the response.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tokens = Counter(
            "switchyard_tokens_total",
            "Tokens reported by upstreams.",
            ["model", "kind"],
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "switchyard_upstream_errors_total",
            "Upstream failures by provider and kind (connect, timeout, status, protocol).",
            ["provider", "kind"],
            registry=self.registry,
        )
        self.fail_open = Counter(
            "switchyard_limits_fail_open_total",
            "Requests served without limits because Redis was unreachable (fail-open mode).",
            registry=self.registry,
        )
        self.redis_restarts = Counter(
            "switchyard_embedded_redis_restarts_total",
            "Times the supervisor restarted the embedded Redis.",
            registry=self.registry,
        )
        self.redis_up = Gauge(
            "switchyard_redis_up", "1 when the last Redis check succeeded.", registry=self.registry
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
