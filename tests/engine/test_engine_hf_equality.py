"""Greedy outputs equal HF transformers token for token, whatever the scheduling does."""

from __future__ import annotations

import pytest
from engine_helpers import MAX_NEW_TOKENS, assert_all_blocks_free, make_llm

from engine.core.cuda_graphs import PaddedDecode
from engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
ARCHS = ["llama", "qwen3"]


def _generate(llm, prompts):
    return [out.token_ids for out in llm.generate(prompts, GREEDY)]


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_hf_without_prefix_caching(arch, checkpoints, hf_reference):
    prompts, expected = hf_reference(arch)
    assert len(prompts) >= 16 and len({len(p) for p in prompts}) > 8
    llm = make_llm(checkpoints(arch), enable_prefix_caching=False)
    assert _generate(llm, prompts) == expected
    assert llm.engine.stats.snapshot()["prefix_cache_hits"] == 0
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_hf_with_prefix_caching(arch, checkpoints, hf_reference):
    prompts, expected = hf_reference(arch)
    # Few seats, so later prompts are admitted after the shared prefix has been cached.
    llm = make_llm(checkpoints(arch), enable_prefix_caching=True, max_num_seqs=4)
    assert _generate(llm, prompts) == expected
    first_hits = llm.engine.stats.snapshot()["prefix_cache_hits"]
    assert first_hits > 0
    # A second pass finds every prompt's full blocks cached and still gives the same tokens.
    assert _generate(llm, prompts) == expected
    snap = llm.engine.stats.snapshot()
    assert snap["prefix_cache_hits"] > 2 * first_hits
    assert 0 < snap["prefix_cache_hit_rate"] < 1
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("budget", [16, 7])
def test_greedy_matches_hf_with_tiny_chunked_prefill(arch, budget, checkpoints, hf_reference):
    prompts, expected = hf_reference(arch)
    llm = make_llm(checkpoints(arch), max_num_batched_tokens=budget, enable_chunked_prefill=True)
    assert _generate(llm, prompts) == expected
    steps = llm.engine.stats.step_history()
    assert max(s.num_prefill_tokens + s.num_decode_tokens for s in steps) <= budget
    # prefill chunks ran in the same steps as other sequences' decodes
    assert any(s.num_prefill_seqs and s.num_decode_seqs for s in steps)
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_greedy_matches_hf_under_preemption(arch, prefix_caching, checkpoints, hf_reference):
    prompts, expected = hf_reference(arch)
    longest = max(len(p) for p in prompts) + MAX_NEW_TOKENS
    blocks = -(-longest // 16) + 2  # room for the longest request and a little more
    llm = make_llm(
        checkpoints(arch),
        num_gpu_blocks=blocks,
        enable_prefix_caching=prefix_caching,
        max_num_batched_tokens=64,
    )
    assert _generate(llm, prompts) == expected
    snap = llm.engine.stats.snapshot()
    assert snap["num_preemptions"] > 0
    # no thrash loop: preemptions stay well below the number of steps
    assert snap["num_preemptions"] < snap["num_steps"]
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_decode_buffers_match_hf(arch, checkpoints, hf_reference, monkeypatch):
    """The fixed-buffer decode path that CUDA graphs replay, run eagerly with padding rows."""
    prompts, expected = hf_reference(arch)
    llm = make_llm(checkpoints(arch), max_num_seqs=12)
    runner = llm.engine.runner
    # buffers for up to 16 rows: 12-seat batches always carry padding rows
    runner.decode = PaddedDecode(
        runner.model, runner.device, 16, runner.max_blocks_per_seq, runner.num_kv_heads
    )
    sizes_used = []
    real_run = runner.decode.run

    def spy(input_ids, positions, meta, num_seqs, max_context_len):
        sizes_used.append(num_seqs)
        return real_run(input_ids, positions, meta, num_seqs, max_context_len)

    monkeypatch.setattr(runner.decode, "run", spy)
    assert _generate(llm, prompts) == expected
    # decode steps ran on the buffers, some padded up to the next captured size
    assert len(sizes_used) > 10 and any(n not in runner.decode.sizes for n in sizes_used)
    assert_all_blocks_free(llm)
