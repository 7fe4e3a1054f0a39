"""The fleet benchmark's workload is the issue's (8 system prompts of exactly 512 tokens x 32
users, interleaved), and its verdict applies the issue's targets."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.fleet import PROMPT_TOKENS, RunResult, report, system_prompts, workload


def test_the_workload_is_eight_512_token_prompts_times_32_users_interleaved(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    from tiny_checkpoint import write_tiny_checkpoint

    from engine.tokenizer import Tokenizer

    tokenizer = Tokenizer(write_tiny_checkpoint(tmp_path / "ckpt", arch="qwen3"))
    prompts = system_prompts(tokenizer, seed=3)
    assert len(prompts) == 8 and len({prompt[:40] for prompt in prompts}) == 8
    for prompt in prompts:
        assert len(tokenizer.encode(prompt, add_special_tokens=False)) == PROMPT_TOKENS
    requests = workload(prompts, seed=1)
    assert len(requests) == 256
    systems = [request["messages"][0]["content"] for request in requests]
    assert systems[:16] == prompts + prompts  # user 1 of each prompt, then user 2 ...
    assert all(request["stream"] and request["ignore_eos"] for request in requests)


def run(routing: str, hit_rate: float, shares: tuple[float, ...]) -> RunResult:
    return RunResult(routing, hit_rate, 50.0, shares, 1.0, 0)


def test_the_verdict_needs_twice_the_hit_rate_and_a_fair_share(capsys) -> None:
    even = (0.33, 0.33, 0.34)
    assert (
        report({"affinity": [run("affinity", 0.8, even)], "round_robin": [run("rr", 0.3, even)]})
        == 0
    )
    assert "met" in capsys.readouterr().out
    assert (
        report({"affinity": [run("affinity", 0.5, even)], "round_robin": [run("rr", 0.3, even)]})
        == 1
    )
    lopsided = (0.6, 0.2, 0.2)  # 1.8x the mean share
    assert (
        report(
            {"affinity": [run("affinity", 0.9, lopsided)], "round_robin": [run("rr", 0.1, even)]}
        )
        == 1
    )
    assert "NOT met" in capsys.readouterr().out
