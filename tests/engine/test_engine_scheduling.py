"""Scheduler limits, aborts mid-batch, KV waste and the stats the gateway reads."""

from __future__ import annotations

import pytest
from engine_helpers import assert_all_blocks_free, make_llm

from engine.config import EngineConfig
from engine.errors import ConfigError, InvalidPromptError, RequestTooLargeError, SamplingParamsError
from engine.sampling import SamplingParams


@pytest.fixture(scope="module")
def llm(llama_path):
    return make_llm(llama_path, max_model_len=256, num_gpu_blocks=40, max_num_seqs=8)


@pytest.fixture(autouse=True)
def blocks_return_after_each_test(request):
    """Every test leaves the shared engine with all blocks free and nothing queued."""
    yield
    if "llm" in request.fixturenames:
        assert_all_blocks_free(request.getfixturevalue("llm"))


def test_requests_that_can_never_fit_are_refused_up_front(llm):
    engine = llm.engine
    with pytest.raises(RequestTooLargeError, match=r"max_model_len \(256\)"):
        engine.add_request("a", [5] * 200, SamplingParams(max_tokens=100))
    small_pool = make_llm(engine.config.model, num_gpu_blocks=4)
    with pytest.raises(RequestTooLargeError, match=r"whole KV cache \(4 blocks"):
        small_pool.engine.add_request("b", [5] * 60, SamplingParams(max_tokens=20))
    with pytest.raises(InvalidPromptError, match="empty"):
        engine.add_request("c", [], SamplingParams())
    with pytest.raises(InvalidPromptError, match="outside the vocabulary"):
        engine.add_request("d", [1, 10**6], SamplingParams())
    with pytest.raises(ValueError, match="2 sampling params for 1 prompts"):
        llm.generate(["x"], [SamplingParams(), SamplingParams()])
    assert not engine.requests  # nothing half-added
    assert_all_blocks_free(llm)


def test_aborts_in_the_middle_of_a_batch_leak_nothing(llm):
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for i in range(8):
        engine.add_request(f"mid-{i}", f"prompt number {i} " * (i + 1), params)
    for _ in range(5):
        engine.step()
    assert engine.block_manager.num_used_blocks > 0
    for i in range(0, 8, 2):
        assert engine.abort_request(f"mid-{i}")
    assert not engine.abort_request("mid-0")  # already gone
    while engine.has_unfinished_requests():
        engine.step()
    assert_all_blocks_free(llm)


def test_kv_waste_stays_under_one_block_per_sequence(llm):
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    for i in range(6):
        engine.add_request(f"w-{i}", "the lazy dog " * (i + 1), params)
    seen = []
    while engine.has_unfinished_requests():
        engine.step()
        snap = engine.stats.snapshot()
        if snap["num_requests_running"]:
            seen.append(snap)
    assert seen
    for snap in seen:
        assert snap["kv_cache_waste_slots_per_seq"] < engine.config.block_size
        assert 0 <= snap["kv_cache_waste_ratio"] < 1
        assert 0 < snap["kv_cache_usage_perc"] <= 1
    assert any(snap["kv_cache_waste_ratio"] > 0 for snap in seen)
    assert_all_blocks_free(llm)


def test_stats_use_vllm_names(llm):
    llm.generate(["hello there"], SamplingParams(max_tokens=4))
    snap = llm.engine.stats.snapshot()
    for name in (
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "prefix_cache_hits",
        "prefix_cache_queries",
        "num_preemptions",
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "e2e_request_latency_seconds",
    ):
        assert name in snap
    assert snap["e2e_request_latency_seconds"]["count"] >= 1
    assert snap["prompt_tokens_total"] > 0 and snap["generation_tokens_total"] >= 4


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"dtype": "int8"}, "dtype"),
        ({"block_size": 12}, "block_size"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"attention_backend": "cuda"}, "attention_backend"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        (
            {"enable_chunked_prefill": False, "max_num_batched_tokens": 64, "max_model_len": 128},
            "chunked",
        ),
    ],
)
def test_bad_engine_config_names_the_setting(settings, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(model="x", **settings)


def test_max_model_len_beyond_the_model_is_refused(llama_path):
    with pytest.raises(ConfigError, match="max_model_len"):
        make_llm(llama_path, max_model_len=10**6)


def test_samples_never_exceed_the_seats(llm):
    """n > 1 reserves a seat per sample at admission: rows and max_num_seqs hold."""
    engine = llm.engine
    with pytest.raises(SamplingParamsError, match=r"n \(9\) exceeds max_num_seqs \(8\)"):
        engine.add_request("too-many", "hello", SamplingParams(n=9))
    params = SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=6, ignore_eos=True)
    for i in range(5):
        engine.add_request(f"n3-{i}", f"the lazy dog number {i} " * 3, params)
    widest = 0
    while engine.has_unfinished_requests():
        engine.step()
        running = engine.scheduler.running
        widest = max(widest, len(running))
        assert len(running) <= 8
        assert len({seq.row for seq in running}) == len(running)
    assert widest >= 6  # two requests' samples ran side by side
    assert_all_blocks_free(llm)
