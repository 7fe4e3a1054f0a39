"""The CUDA-only paths, checked on the CPU: the memory profile, graph capture failures, and
flash-decoding splits taken from the step's real context lengths."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from engine_helpers import assert_all_blocks_free, make_llm

from engine import kernels
from engine.core.cuda_graphs import PaddedDecode, choose_kv_splits, split_buckets
from engine.core.memory_profile import graph_pool_estimate, kv_pool_bytes, profile_step_inputs
from engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
PROMPTS = ["the quick brown fox", "a gateway sends each request to the model"]


def test_profile_step_layout_covers_the_budget_on_disjoint_blocks():
    inputs, num_blocks = profile_step_inputs(
        max_num_batched_tokens=1000, max_num_seqs=64, max_model_len=4096, block_size=16
    )
    assert inputs.num_tokens == 1000 and inputs.num_seqs == 64
    assert inputs.num_sampled == 64 and sorted(inputs.sample_rows) == list(range(64))
    lens = np.diff(inputs.cu_seqlens_q)
    assert lens.min() >= 15 and lens.max() <= 16 and (inputs.context_lens == lens).all()
    # each sequence writes its own blocks, all inside the temporary cache
    used = [set(inputs.block_tables[b, : -(-int(n) // 16)].tolist()) for b, n in enumerate(lens)]
    assert sum(len(u) for u in used) == len(set().union(*used)) == num_blocks
    assert inputs.slot_mapping.min() >= 0 and inputs.slot_mapping.max() < num_blocks * 16
    # fewer tokens than sampler rows: every row of the sampler still runs
    small, _ = profile_step_inputs(8, 64, 4096, 16)
    assert small.num_seqs == 8 and small.num_sampled == 64


def test_profile_step_runs_the_paged_path_and_the_full_width_sampler(llama_path, monkeypatch):
    llm = make_llm(llama_path, max_num_batched_tokens=96, max_num_seqs=12)
    runner = llm.engine.runner
    expected = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    attention_tokens, sampler_calls = [], []
    real_attention = kernels.paged_attention
    real_sdpa = torch.nn.functional.scaled_dot_product_attention
    inside_paged = []

    def paged(query, *args, **kwargs):
        attention_tokens.append(query.shape[0])
        inside_paged.append(True)
        try:
            return real_attention(query, *args, **kwargs)
        finally:
            inside_paged.pop()

    def no_sdpa(*args, **kwargs):
        # the torch paged path batches with SDPA over bounded groups; nothing else may
        if not inside_paged:
            raise AssertionError("the profile must not take the O(T^2) SDPA path")
        return real_sdpa(*args, **kwargs)

    real_sampler = runner.sampler

    def sampler(logits, batch):
        sampler_calls.append((tuple(logits.shape), batch))
        return real_sampler(logits, batch)

    monkeypatch.setattr(kernels, "paged_attention", paged)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", no_sdpa)
    monkeypatch.setattr(runner, "sampler", sampler)
    temporary = runner.run_profile_step()

    # its own paged cache, sized for the step, is not counted as activation memory
    _, blocks = profile_step_inputs(96, 12, runner.max_model_len, runner.block_size)
    assert temporary == blocks * runner.kv_bytes_per_block

    layers = runner.args.num_layers
    assert attention_tokens == [96] * layers  # every layer, the whole token budget, paged
    [(shape, batch)] = sampler_calls
    assert shape == (12, runner.args.vocab_size)  # [max_num_seqs, vocab] logits
    assert batch.count_penalties is not None and batch.banned is not None
    assert batch.repetition is not None  # the penalty and its seen table
    assert batch.top_k is not None and batch.top_p is not None and batch.min_p is not None
    assert batch.num_logprobs == 20 and not batch.all_greedy
    # structured outputs: a grammar mask over all rows but one, and logit_bias
    assert batch.grammar is not None and batch.grammar.bitmask.shape[0] == 11
    assert batch.logit_bias is not None
    # the temporary cache is gone and serving is untouched by the profile's sampler rows
    for layer, attn in enumerate(runner.model.attention_layers()):
        assert attn.k_cache.data_ptr() == runner.kv_cache[0, layer].data_ptr()
    monkeypatch.undo()
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected
    assert_all_blocks_free(llm)


def test_kv_pool_gets_what_is_left_after_peak_sampler_and_graphs():
    gib = 1 << 30
    # 140 GiB at 0.9, 20 GiB held (weights, sampler counts, buffers), a 3 GiB step peak
    # (sampler temporaries included) and a 1 GiB graph pool
    assert kv_pool_bytes(140 * gib, 0.9, 20 * gib, 3 * gib, gib) == int(126 * gib) - 24 * gib
    # the graph pool: the largest capture's peak once, plus every graph's kept output
    assert graph_pool_estimate([300, 500], [10, 20, 30]) == 560
    assert graph_pool_estimate([], []) == 0


class _BrokenGraph:
    def __init__(self) -> None:
        raise ValueError("simulated capture failure")  # not a RuntimeError


@pytest.mark.parametrize("error", [ValueError, TypeError, AssertionError, KeyError])
def test_any_capture_failure_falls_back_to_eager_with_a_warning(llama_path, error, caplog):
    llm = make_llm(llama_path, max_num_seqs=4)
    runner = llm.engine.runner
    runner.decode = PaddedDecode(
        runner.model, runner.device, 4, runner.max_blocks_per_seq, runner.num_kv_heads
    )

    def broken() -> None:
        raise error("simulated capture failure")

    with caplog.at_level(logging.WARNING, logger="engine.core.cuda_graphs"):
        assert runner.decode.capture_graphs(new_graph=broken) is False
    assert not runner.decode.graphs and not runner.decode.outputs
    assert "decode runs eagerly" in caplog.text and error.__name__ in caplog.text
    out = llm.generate(PROMPTS, GREEDY)  # serving goes on, on the padded eager path
    assert all(len(o.token_ids) == 8 for o in out)


def test_the_runner_survives_a_failed_capture_at_start_up(llama_path, monkeypatch, caplog):
    llm = make_llm(llama_path, max_num_seqs=4)
    expected = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    runner = llm.engine.runner
    runner.decode = PaddedDecode(
        runner.model, runner.device, 4, runner.max_blocks_per_seq, runner.num_kv_heads
    )
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _BrokenGraph)
    with caplog.at_level(logging.WARNING):
        runner._capture_graphs()
    assert "ValueError" in caplog.text and not runner.decode.graphs
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected


def test_kv_splits_follow_the_real_context_not_max_model_len():
    h200 = 132
    # one short sequence: nothing to split, however long max_model_len is
    assert choose_kv_splits(1, 8, 1, 200, h200) == 1
    assert choose_kv_splits(1, 8, 1, 600, h200) == 2
    assert choose_kv_splits(1, 8, 1, 1100, h200) == 4
    assert choose_kv_splits(1, 8, 1, 40960, h200) == 16
    # a full batch fills the GPU without splitting; prefill never splits
    assert choose_kv_splits(256, 8, 1, 40960, h200) == 1
    assert choose_kv_splits(1, 8, 64, 40960, h200) == 1
    assert choose_kv_splits(4, 8, 1, 40960, 0) == 1  # no SM count (CPU)
    # graphs: one per split count a padded size can pick
    assert split_buckets(1, 8, h200) == [1, 2, 4, 8, 16]
    assert split_buckets(16, 8, h200) == [1, 2]
    assert split_buckets(256, 8, h200) == [1]


def test_decode_splits_are_chosen_per_step_from_context_lengths(llama_path, monkeypatch):
    llm = make_llm(llama_path, max_num_seqs=4, max_model_len=2048)
    runner = llm.engine.runner
    runner.decode = PaddedDecode(
        runner.model, runner.device, 4, runner.max_blocks_per_seq, runner.num_kv_heads, sms=132
    )
    # every (size, splits) pair the buffers can run has a graph key to capture
    keys = runner.decode.graph_keys()
    assert (1, 16) in keys and (4, 1) in keys and keys[0][0] == 4
    seen: list[tuple[int, int | None]] = []
    real_attention = kernels.paged_attention

    def paged(query, k_cache, v_cache, meta, *args, **kwargs):
        seen.append((int(meta.context_lens.max()), meta.num_kv_splits))
        return real_attention(query, k_cache, v_cache, meta, *args, **kwargs)

    monkeypatch.setattr(kernels, "paged_attention", paged)
    short = llm.generate(["hello"], SamplingParams(temperature=0.0, max_tokens=4))
    long_prompt = [3 + i % 500 for i in range(700)]
    long = llm.generate([long_prompt], SamplingParams(temperature=0.0, max_tokens=4))
    assert short[0].token_ids and long[0].token_ids
    decode_splits = {ctx: splits for ctx, splits in seen if ctx < 10 or ctx > 700}
    assert all(s == 1 for c, s in decode_splits.items() if c < 10)  # short: no split
    assert any(s == 2 for c, s in decode_splits.items() if c > 700)  # ~700 tokens: 2
