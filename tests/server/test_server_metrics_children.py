"""The metrics' label children, found by a dict lookup once seen: the same series as
prometheus_client's own ``labels`` gives, whatever the value's type, and none kept past a
``remove`` or ``clear``."""

from __future__ import annotations

from gateway.metrics import Metrics


def _series(metrics: Metrics, name: str) -> list[str]:
    return [
        line
        for line in metrics.render().decode().splitlines()
        if line.startswith(name + "{") and 'route="r"' in line
    ]


def test_a_label_value_seen_twice_counts_in_one_series() -> None:
    metrics = Metrics()
    metrics.requests.labels("r", "m", "p", 200).inc()
    metrics.requests.labels("r", "m", "p", "200").inc()
    metrics.requests.labels(route="r", model="m", provider="p", status="200").inc()
    assert metrics.requests.labels("r", "m", "p", "200") is metrics.requests.labels(
        "r", "m", "p", 200
    )
    assert _series(metrics, "switchyard_requests_total") == [
        'switchyard_requests_total{model="m",provider="p",route="r",status="200"} 3.0'
    ]


def test_a_removed_or_cleared_series_starts_again_from_zero() -> None:
    metrics = Metrics()
    metrics.latency.labels("r").observe(0.002)
    metrics.latency.remove("r")
    assert _series(metrics, "switchyard_request_duration_seconds_count") == []
    metrics.latency.labels("r").observe(0.003)
    assert _series(metrics, "switchyard_request_duration_seconds_count") == [
        'switchyard_request_duration_seconds_count{route="r"} 1.0'
    ]
    metrics.latency.clear()
    metrics.latency.labels("r").observe(0.004)
    assert _series(metrics, "switchyard_request_duration_seconds_count") == [
        'switchyard_request_duration_seconds_count{route="r"} 1.0'
    ]
