"""The engine benchmark harness and the GPU check script work end to end on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]


def run_bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "bench.engine", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def bench_record(*args: str, timeout: float = 120) -> dict:
    """Run the bench, which must succeed and print one JSON line: that record."""
    result = run_bench(*args, timeout=timeout)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 1
    return json.loads(lines[0])


def test_tiny_w1_prints_one_json_line_with_the_figures():
    record = bench_record("--workload", "W1", "--tiny", "--device", "cpu")
    assert record["workload"] == "W1"
    assert record["model"] == "tiny-qwen3"
    assert record["shape"]["num_kv_heads"] == 2
    assert record["device"].startswith("cpu")
    assert record["dtype"] == "float32"
    # Every request made its full output: EOS is ignored.
    assert record["requests"] == record["requests_completed"] == 8
    assert record["output_tokens"] == 8 * record["output_len"]
    assert 8 * 16 <= record["prompt_tokens"] <= 8 * 64
    assert not record["truncated"]
    assert record["output_tok_s"] > 0
    assert record["total_tok_s"] > record["output_tok_s"]
    assert 0 < record["ttft_p50_s"] <= record["ttft_p99_s"] <= record["wall_s"]
    assert 0 < record["itl_p50_s"] <= record["itl_p99_s"]
    assert 0 < record["kv_usage_peak"] <= 1
    assert record["peak_memory_bytes"] > record["weight_bytes"] > 0
    assert record["date"].startswith("20")


def test_a_run_past_its_time_cap_still_reports_and_says_so():
    record = bench_record("--workload", "W1", "--tiny", "--device", "cpu", "--max-seconds", "0.01")
    assert record["truncated"] is True
    assert record["requests"] == 8
    assert record["requests_completed"] < 8


@pytest.mark.slow
def test_tiny_smollm2_compares_the_engine_with_hf_on_the_real_model():
    record = bench_record("--workload", "smollm2", "--tiny", timeout=300)
    assert record["workload"] == "smollm2" and record["model"].endswith("Q4_1.gguf")
    for batch in (1, 2):
        figures = record[f"batch_{batch}"]
        assert figures["engine_tok_s"] > 0 and figures["hf_tok_s"] > 0
        assert figures["ratio"] == pytest.approx(
            figures["engine_tok_s"] / figures["hf_tok_s"], rel=0.01
        )
    assert [r["tokens"] for r in record["runs"]] == [4, 8]  # EOS ignored on both sides


def test_bad_arguments_get_a_clear_error():
    result = run_bench("--workload", "W9", "--tiny")
    assert result.returncode == 2
    assert "invalid choice: 'W9'" in result.stderr
    result = run_bench("--workload", "W1", "--tiny", "--max-seconds", "0")
    assert result.returncode == 2
    assert "--max-seconds must be > 0" in result.stderr


def test_gpu_check_dry_run_plans_every_step(tmp_path):
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), "--dry-run"],
        cwd=REPO,
        env={**os.environ, "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    steps = ("kernel_tests", "engine_triton", "serve_default_model", "bench_W1", "bench_W2")
    for step in (*steps, "bench_W3", "bench_W4"):
        assert f"[plan] {step}" in result.stdout
    assert (tmp_path / "summary.txt").read_text() == result.stdout


@pytest.mark.parametrize("extra", [(), ("--penalties",)])
def test_tiny_host_workload_reports_per_step_figures(extra):
    record = bench_record("--workload", "host", "--tiny", *extra)
    assert record["workload"] == "host"
    assert record["sampling"] == ("presence+repetition_penalty+top_p" if extra else "greedy")
    # every request streamed its whole output (EOS ignored), as text too
    assert record["output_tokens"] == record["requests"] * record["output_len"] == 16 * 24
    assert record["output_chars"] >= record["output_tokens"]
    # decode steps with the batch full enough were found and timed
    assert 0 < record["decode_steps"] < record["steps"]
    assert 0 < record["step_wall_ms_p50"] <= record["step_wall_ms_p90"]
    assert record["step_thread_cpu_ms_p50"] > 0
    assert record["cpu_ms_per_decode_step"] > 0
    assert record["cpu_s"] > 0 and record["wall_s"] > 0
    assert record["host_threads"]["mode"] == "auto"


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="binding threads needs Linux and two CPUs",
)
def test_host_workload_on_one_cpu_reports_the_binding():
    record = bench_record("--workload", "host", "--tiny", "--host-threads", "one-cpu")
    placement = record["host_threads"]
    assert placement["mode"] == "one-cpu" and placement["one_cpu"] is True
    assert placement["cpu"] in os.sched_getaffinity(0)
    assert record["output_tokens"] == 16 * 24


def test_outputs_workload_reports_the_event_loops_cost_per_token():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.engine_outputs",
            "--repeats",
            "1",
            "--steps-per-hand-over",
            "4",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert record["detokenizer"] == "TokenBytes"  # the tiny checkpoint's tokenizer is byte-level
    # figures only: which is larger is the box's business on a busy machine
    assert record["process_steps_us_per_token"] > 0 and record["with_delivery_us_per_token"] > 0
    assert len(record["runs"]["process_steps"]) == len(record["runs"]["with_delivery"]) == 1
    assert record["steps_per_hand_over"] == 4 and record["cpu"]


def test_host_workload_beside_nano_vllm_needs_a_checkout(tmp_path):
    """``--nano-vllm PATH`` that is not a nano-vllm checkout is refused with a clear error."""
    done = run_bench("--workload", "host", "--tiny", "--nano-vllm", str(tmp_path))
    assert done.returncode != 0
    assert "is not a nano-vllm checkout" in done.stderr
