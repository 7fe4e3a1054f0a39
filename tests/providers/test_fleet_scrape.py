"""Reading replica load from Prometheus pages: vLLM (old and new names), SGLang and Switchyard's
own engine metrics; label filtering by model; hostile pages; and the fetch's failure kinds
against real loopback servers."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from fleet_replica import FakeReplica
from prometheus_client import CollectorRegistry, generate_latest

from gateway.metrics import EngineCollector
from gateway.providers.fleet.scrape import ScrapeError, ScrapeSettings, parse_load, scrape

VLLM_V1_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 4.0
vllm:num_requests_running{engine="1",model_name="qwen"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 5.0
vllm:num_requests_waiting{engine="1",model_name="qwen"} 2.0
vllm:num_requests_waiting{engine="0",model_name="llama"} 40.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="qwen"} 0.5
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.9
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="qwen"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="qwen"} 600.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="qwen"} 750.0
vllm:prefix_cache_hits_total{engine="1",model_name="qwen"} 50.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="qwen"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="qwen"} 17.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="qwen"} 17.0
"""


def test_vllm_v1_page_filtered_by_model_sums_engines_and_takes_the_fullest_cache() -> None:
    load = parse_load(VLLM_V1_PAGE, model="qwen")
    assert (load.waiting, load.running, load.kv_usage) == (7, 7, 0.5)
    assert (load.prefix_hits, load.prefix_queries) == (800.0, 1600.0)
    assert load.prefix_hit_rate is None and load.recognized


def test_without_a_model_every_series_counts() -> None:
    load = parse_load(VLLM_V1_PAGE)
    assert (load.waiting, load.kv_usage) == (47, 0.9)
    other = parse_load(VLLM_V1_PAGE, model="mistral")
    assert (other.waiting, other.kv_usage, other.recognized) == (0, None, False)


@pytest.mark.parametrize(
    ("page", "model", "expected"),
    [
        pytest.param(
            'vllm:num_requests_waiting{model_name="m"} 3\n'
            'vllm:gpu_cache_usage_perc{model_name="m"} 0.75\n'
            'vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.6\n'
            'vllm:gpu_prefix_cache_hits_total{model_name="m"} 30\n'
            'vllm:gpu_prefix_cache_queries_total{model_name="m"} 50\n',
            "m",
            {
                "waiting": 3,
                "kv_usage": 0.75,
                "prefix_hit_rate": 0.6,
                "prefix_hits": 30.0,
                "prefix_queries": 50.0,
            },
            id="older_vllm_names_and_the_v0_hit_rate_gauge",
        ),
        # Switchyard exports vLLM's names without the prefix, and (later) also with it: no
        # double count, and the newer KV name wins over the older one.
        pytest.param(
            "num_requests_waiting 4.0\n"
            "vllm:num_requests_waiting 4.0\n"
            "vllm:gpu_cache_usage_perc 0.9\n"
            "vllm:kv_cache_usage_perc 0.2\n"
            "prefix_cache_hits_total 10.0\n"
            "prefix_cache_queries_total 40.0\n",
            None,
            {"waiting": 4, "kv_usage": 0.2, "prefix_hits": 10.0, "prefix_queries": 40.0},
            id="one_spelling_counts_when_a_server_exports_several",
        ),
        pytest.param(
            '# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{model_name="q"} 12.0\n'
            'sglang:num_running_reqs{model_name="q"} 30.0\n'
            'sglang:token_usage{model_name="q"} 0.28\n'
            'sglang:cache_hit_rate{model_name="q"} 0.4\n'
            'sglang:prompt_tokens_total{model_name="q"} 2000.0\n'
            'sglang:cached_tokens_total{cache_source="device",model_name="q"} 600.0\n'
            'sglang:cached_tokens_total{cache_source="host",model_name="q"} 200.0\n',
            "q",
            {
                "waiting": 12,
                "running": 30,
                "kv_usage": 0.28,
                "prefix_hit_rate": 0.4,
                "prefix_hits": 800.0,
                "prefix_queries": 2000.0,
            },
            id="sglang_names",
        ),
        pytest.param(
            "vllm:num_requests_waiting NaN\n"
            "vllm:num_requests_waiting +Inf\n"
            "vllm:num_requests_waiting{model_name=} 9\n"
            "vllm:num_requests_waiting not-a-number\n"
            "vllm:num_requests_waiting\n"
            "vllm:num_requests_waiting{\n"
            'vllm:num_requests_waiting{model_name="a \\"quoted\\" } name",x="1"} 2 1700000000000\n'
            "vllm:num_requests_waiting\t3\n"
            "\x00\xff garbage {{{ }}}\n"
            "vllm:kv_cache_usage_perc -Inf\n",
            'a "quoted" } name',
            {"waiting": 5, "kv_usage": None},
            id="hostile_and_odd_lines_are_skipped_not_raised",
        ),
        pytest.param(
            "# nothing here\nprocess_cpu_seconds_total 12.5\n",
            None,
            {"recognized": False, "waiting": 0, "running": 0, "kv_usage": None},
            id="a_page_with_none_of_the_names_reads_as_unknown_load",
        ),
    ],
)
def test_a_page_reads_as(page: str, model: str | None, expected: dict[str, Any]) -> None:
    load = parse_load(page, model)
    assert {field: getattr(load, field) for field in expected} == expected


def test_switchyards_own_engine_collector_is_read() -> None:
    registry = CollectorRegistry()
    stats = {
        "num_requests_running": 2,
        "num_requests_waiting": 6,
        "kv_cache_usage_perc": 0.375,
        "prefix_cache_queries": 512,
        "prefix_cache_hits": 384,
        "num_preemptions": 0,
    }
    registry.register(EngineCollector(lambda: stats))
    load = parse_load(generate_latest(registry).decode())
    assert (load.waiting, load.running, load.kv_usage) == (6, 2, 0.375)
    assert (load.prefix_hits, load.prefix_queries) == (384.0, 512.0)


async def _serve(handler: web.RequestHandler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def test_scrape_reads_a_live_vllm_style_page() -> None:
    replica = await FakeReplica().start()
    replica.waiting, replica.running, replica.kv_usage = 9, 3, 0.625
    try:
        async with aiohttp.ClientSession() as session:
            load = await scrape(session, replica.url, ScrapeSettings(model_name="tiny"))
    finally:
        await replica.stop()
    assert (load.waiting, load.running, load.kv_usage) == (9, 3, 0.625)


@pytest.mark.parametrize(
    ("behaviour", "kind"),
    [("status", "status"), ("huge", "too_large"), ("slow", "timeout"), ("closed", "connect")],
)
async def test_scrape_failures_have_a_kind(behaviour: str, kind: str) -> None:
    async def handler(_request: web.Request) -> web.StreamResponse:
        if behaviour == "status":
            return web.Response(status=503, text="loading")
        if behaviour == "slow":
            await asyncio.sleep(1)
        return web.Response(text="vllm:num_requests_waiting 1\n" * 4000)  # ~112 kB

    runner, url = await _serve(handler)
    if behaviour == "closed":
        await runner.cleanup()
    settings = ScrapeSettings(timeout_s=0.3, max_bytes=64 * 1024)
    try:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(ScrapeError) as caught:
                await scrape(session, url, settings)
    finally:
        await runner.cleanup()
    assert caught.value.kind == kind


def test_settings_refuse_nonsense_naming_the_field() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        ScrapeSettings(interval_s=0)
    with pytest.raises(ValueError, match="metrics_path"):
        ScrapeSettings(metrics_path="metrics")
