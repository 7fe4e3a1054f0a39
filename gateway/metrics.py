"""Prometheus metrics, one registry per app so that several apps can live in one process."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _KnownChildren:
    """``labels`` in one dict lookup for label values seen before. prometheus_client's own takes
    a lock and converts every value to ``str`` on each call, about 3 µs, and a request makes
    seven such calls. The children are the library's: a value seen twice, as ``200`` and
    ``"200"``, gets the same one."""

    def labels(self, *values: Any, **named: Any) -> Any:
        if named:
            return super().labels(*values, **named)  # type: ignore[misc]
        known: dict[tuple[Any, ...], Any] | None = self.__dict__.get("_known")
        if known is None:
            known = self.__dict__["_known"] = {}
        child = known.get(values)
        if child is None:
            child = known[values] = super().labels(*values)  # type: ignore[misc]
        return child

    def remove(self, *values: Any) -> None:
        self.__dict__.pop("_known", None)
        super().remove(*values)  # type: ignore[misc]

    def clear(self) -> None:
        self.__dict__.pop("_known", None)
        super().clear()  # type: ignore[misc]


class Counter(_KnownChildren, prometheus_client.Counter):
    pass


class Gauge(_KnownChildren, prometheus_client.Gauge):
    pass


class Histogram(_KnownChildren, prometheus_client.Histogram):
    pass


# switchyard_breaker_state values (the usual closed/open/half-open gauge encoding).
BREAKER_STATE_CODES = {"closed": 0, "open": 1, "half_open": 2}


class RoutingCollector(Collector):
    """Reads the routing health at scrape time, so a breaker that cooled down shows half-open
    without waiting for a request to notice."""

    def __init__(self, snapshot: Callable[[], Mapping[str, Mapping[str, Any]]]) -> None:
        # ``RoutingState.snapshot``: breakers, latency_ewma_s and inflight, read at scrape time.
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snapshot = self.snapshot()
        breakers = GaugeMetricFamily(
            "switchyard_breaker_state",
            "Circuit breaker per provider/model target: 0 closed, 1 open, 2 half-open.",
            labels=["target"],
        )
        for target, state in sorted(snapshot["breakers"].items()):
            breakers.add_metric([target], BREAKER_STATE_CODES[state])
        latency = GaugeMetricFamily(
            "switchyard_route_latency_ewma_seconds",
            "EWMA of time to first byte per model, as lowest_latency routing sees it.",
            labels=["model"],
        )
        for model, seconds in sorted(snapshot["latency_ewma_s"].items()):
            latency.add_metric([model], seconds)
        inflight = GaugeMetricFamily(
            "switchyard_upstream_inflight",
            "Requests in flight per provider (max_concurrency skips a provider at its limit).",
            labels=["provider"],
        )
        for provider, count in sorted(snapshot["inflight"].items()):
            inflight.add_metric([provider], count)
        return iter((breakers, latency, inflight))


# The local engine's latencies span sub-millisecond decode steps to minute-long requests.
ENGINE_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip


# vLLM's namespace: the engine's series are exported under it as well as without it.
VLLM_PREFIX = "vllm:"


class EngineCollector(Collector):
    """The in-process engine's gauges and counters under vLLM's names, read at scrape time:
    without a prefix (what the KEDA queries in deploy/ read) and with vLLM's ``vllm:`` one
    (what vLLM-aware routers read; a scraper takes one spelling, never both)."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        snap = self.stats()
        gauges = (
            ("num_requests_running", "Requests in the engine's running batch."),
            ("num_requests_waiting", "Requests queued for the engine."),
            ("kv_cache_usage_perc", "KV cache blocks in use, a ratio in [0, 1]."),
        )
        counters = (
            ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
            ("prefix_cache_hits", "Prompt tokens found in the prefix cache."),
            ("num_preemptions", "Sequences preempted (recomputed) for lack of KV blocks."),
        )
        # Each also as ``vllm:<name>``, so that routers and dashboards made for vLLM (and the
        # fleet provider) read a Switchyard engine as they read a vLLM server.
        for prefix in ("", VLLM_PREFIX):
            for name, doc in gauges:
                yield GaugeMetricFamily(prefix + name, doc, value=snap[name])
            for name, doc in counters:
                yield CounterMetricFamily(prefix + name, doc, value=snap[name])


@dataclass(frozen=True)
class FleetReplicaGauge:
    """One engine-fleet replica as the gateway sees it (read at scrape time)."""

    provider: str
    replica: str  # host:port
    up: bool  # False while ejected
    inflight: int  # requests from this gateway
    waiting: int | None  # the replica's own queue, as last scraped (None: not yet)
    kv_usage: float | None


class FleetCollector(Collector):
    """Each fleet replica's state: ``switchyard_fleet_replica_{up,inflight,waiting,kv_usage}``."""

    def __init__(self, rows: Callable[[], Iterable[FleetReplicaGauge]]) -> None:
        self.rows = rows

    def collect(self) -> Iterator[Metric]:
        labels = ["provider", "replica"]
        up = GaugeMetricFamily(
            "switchyard_fleet_replica_up",
            "1 while a fleet replica takes requests, 0 while it is ejected (probed back).",
            labels=labels,
        )
        inflight = GaugeMetricFamily(
            "switchyard_fleet_replica_inflight",
            "Requests this gateway has in flight on a fleet replica.",
            labels=labels,
        )
        waiting = GaugeMetricFamily(
            "switchyard_fleet_replica_waiting",
            "A fleet replica's waiting queue, as last scraped from its /metrics.",
            labels=labels,
        )
        kv_usage = GaugeMetricFamily(
            "switchyard_fleet_replica_kv_usage",
            "A fleet replica's KV cache use (0..1), as last scraped from its /metrics.",
            labels=labels,
        )
        for row in self.rows():
            key = [row.provider, row.replica]
            up.add_metric(key, 1.0 if row.up else 0.0)
            inflight.add_metric(key, row.inflight)
            if row.waiting is not None:
                waiting.add_metric(key, row.waiting)
            if row.kv_usage is not None:
                kv_usage.add_metric(key, row.kv_usage)
        return iter((up, inflight, waiting, kv_usage))


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
            "Upstream failures by provider and kind (connect, timeout, status, protocol, auth).",
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
        self.admin_auth_failures = Counter(
            "switchyard_admin_auth_failures_total",
            "Wrong admin credentials by door: admin_bearer (/admin/*), dashboard_login.",
            ["what"],
            registry=self.registry,
        )
        self.redis_up = Gauge(
            "switchyard_redis_up", "1 when the last Redis check succeeded.", registry=self.registry
        )
        self.upstream_attempts = Counter(
            "switchyard_upstream_attempts_total",
            "Tries of route candidates by outcome: ok, failed (then retried or fallen back), "
            "skipped (breaker open, provider full, no API key).",
            ["provider", "model", "outcome"],
            registry=self.registry,
        )
        self.fallbacks = Counter(
            "switchyard_route_fallbacks_total",
            "Requests served by a later candidate than the route's first choice.",
            ["first_model", "served_model"],
            registry=self.registry,
        )

        # Usage-side metrics: the same numbers the ledger records, so both can be reconciled.
        self.ttft = Histogram(
            "switchyard_time_to_first_token_seconds",
            "Streams: time from request to the first upstream chunk relayed.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.overhead = Histogram(
            "switchyard_gateway_overhead_seconds",
            "Time spent in the gateway, not waiting on an upstream (JSON: total minus upstream "
            "calls; streams: time to response headers minus upstream calls).",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        # Whole nano-dollars (1e-9 USD) in integer steps: a float sum of USD would round.
        self.cost = Counter(
            "switchyard_cost_nanos_total",
            "Cost charged in nano-dollars (1e-9 USD; price table in force at request time), "
            "as recorded in usage.",
            ["model"],
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "switchyard_rate_limited_total",
            "Requests refused by the gateway's own limits, by error code.",
            ["code"],
            registry=self.registry,
        )
        self.fleet_picks = Counter(
            "switchyard_fleet_picks_total",
            "Replicas picked by engine fleets, by why (affinity, load, spill, ejected-skip, "
            "failover, round_robin).",
            ["provider", "replica", "reason"],
            registry=self.registry,
        )
        self.spool_depth = Gauge(
            "switchyard_usage_spool_depth",
            "Usage events in the local spool waiting for Redis (read at scrape time).",
            registry=self.registry,
        )
        self.settle_spool_depth = Gauge(
            "switchyard_settle_spool_depth",
            "Limiter settles and releases in the local spool waiting for Redis (read at scrape "
            "time).",
            registry=self.registry,
        )

        # The exporter's view of the Redis buffer (the same for every replica of one store) and
        # what this replica moved into the usage store.
        self.exported = Counter(
            "switchyard_usage_exported_total",
            "Usage events the exporter took from the Redis buffer, by outcome: inserted (new in "
            "the store), duplicate (the store had it: a re-delivery), rejected (the store could "
            "not keep it: kept as a dead letter, see switchyard_usage_dead_letters).",
            ["outcome"],
            registry=self.registry,
        )
        self.export_errors = Counter(
            "switchyard_usage_export_errors_total",
            "Export rounds that failed, by what failed: redis, store.",
            ["stage"],
            registry=self.registry,
        )
        self.export_batch = Histogram(
            "switchyard_usage_export_batch_seconds",
            "Time to insert one batch of usage events into the store.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.export_lag = Gauge(
            "switchyard_usage_export_lag_seconds",
            "Age of the oldest usage event not yet in the store (0 when the buffer is empty).",
            registry=self.registry,
        )
        self.export_backlog = Gauge(
            "switchyard_usage_export_backlog",
            "Usage events in the Redis buffer, not yet in the store.",
            registry=self.registry,
        )
        self.export_pending = Gauge(
            "switchyard_usage_export_pending",
            "Buffered usage events read by an exporter and not yet acknowledged.",
            registry=self.registry,
        )
        self.usage_dead_letters = Gauge(
            "switchyard_usage_dead_letters",
            "Usage events the store could not keep, waiting in its dead letters for an admin "
            "to replay them (GET /admin/usage/dead-letters); counted every 15 s.",
            registry=self.registry,
        )

    def watch_engine(self, stats: Callable[[], dict[str, Any]]) -> None:
        """Expose the local engine (vLLM's metric names); its latencies are observed per
        request by the local provider into the three histograms made here."""
        self.registry.register(EngineCollector(stats))
        histograms = (
            ("time_to_first_token_seconds", "Local engine: time to the first generated token."),
            ("inter_token_latency_seconds", "Local engine: time between generated tokens."),
            ("e2e_request_latency_seconds", "Local engine: time from arrival to the last token."),
        )
        self.engine_ttft, self.engine_itl, self.engine_e2e = (
            Histogram(name, doc, buckets=ENGINE_LATENCY_BUCKETS, registry=self.registry)
            for name, doc in histograms
        )

    def watch_routing(self, snapshot: Callable[[], Mapping[str, Mapping[str, Any]]]) -> None:
        """Read the routing health (breaker states, latency averages, requests in flight) at
        scrape time, from ``RoutingState.snapshot``."""
        self.registry.register(RoutingCollector(snapshot))

    def watch_fleets(self, rows: Callable[[], Iterable[FleetReplicaGauge]]) -> None:
        """Read the engine fleets' replicas at scrape time."""
        self.registry.register(FleetCollector(rows))

    def watch_engine_health(self, healthy: Callable[[], bool]) -> None:
        """``engine_healthy``: 1 while the local engine serves; 0 while it loads, after a failed
        load and once a tensor-parallel rank has died (read at scrape time)."""
        gauge = Gauge(
            "engine_healthy",
            "1 when the in-process engine can serve, else 0 (see /readyz for why).",
            registry=self.registry,
        )
        gauge.set_function(lambda: 1.0 if healthy() else 0.0)

    def watch_spool(self, depth: Callable[[], int], settles: Callable[[], int]) -> None:
        """Read the usage and settle spools' depths at scrape time."""
        self.spool_depth.set_function(depth)
        self.settle_spool_depth.set_function(settles)

    def render(self) -> bytes:
        return generate_latest(self.registry)
