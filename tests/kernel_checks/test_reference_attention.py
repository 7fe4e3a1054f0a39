"""The torch paged attention (batched, the CPU path and the Triton tests' oracle) against the
definition written out one sequence and one head at a time: every layout, the groups and
row chunks a small budget forces, a plan made once and reused, and garbage in the cache."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.kernels.reference import paged_attention_ref, plan_paged_attention

from .kernel_cases import AttentionBatch, make_batch, tolerance

# decodes of mixed lengths, fresh prefills, a chunk over a cached prefix, padding rows
MIXED = [(1, 37), (19, 19), (0, 0), (21, 71), (1, 5), (3, 40), (1, 1), (0, 0), (40, 40)]
DECODES = [(1, 37), (1, 5), (1, 70), (1, 1), (1, 16)]  # the common step: rows in order


def by_definition(batch: AttentionBatch) -> torch.Tensor:
    query, k_cache, v_cache = batch.query, batch.k_cache, batch.v_cache
    _, num_heads, _ = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    out = torch.zeros_like(query)
    starts, lens = batch.meta.cu_seqlens_q.tolist(), batch.meta.context_lens.tolist()
    for b, context_len in enumerate(lens):
        q_len = starts[b + 1] - starts[b]
        for i in range(q_len if context_len else 0):
            position = context_len - q_len + i
            slots = [
                int(batch.meta.block_tables[b, p // block_size]) * block_size + p % block_size
                for p in range(position + 1)
            ]
            keys = k_cache.reshape(-1, num_kv_heads, k_cache.shape[-1])[slots].float()
            values = v_cache.reshape(-1, num_kv_heads, v_cache.shape[-1])[slots].float()
            for h in range(num_heads):
                kv = h // (num_heads // num_kv_heads)
                q = query[starts[b] + i, h].float()
                weights = torch.softmax(keys[:, kv] @ q * batch.scale, dim=0)
                out[starts[b] + i, h] = (weights @ values[:, kv]).to(out.dtype)
    return out


@pytest.mark.parametrize("layout", [MIXED, DECODES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("budget", [1 << 23, 4096, 1])  # one group; several; a row each
def test_batched_reference_equals_the_definition(layout, dtype, group, budget):
    batch = make_batch(
        layout, num_heads=2 * group, num_kv_heads=2, dtype=dtype, trailing_pad_tokens=2
    )
    expected = by_definition(batch)
    actual = paged_attention_ref(*batch.args(), budget=budget)
    assert actual.dtype == dtype
    torch.testing.assert_close(actual.float(), expected.float(), **tolerance(dtype))
    assert actual[-2:].abs().sum() == 0  # rows past the last sequence stay zero
    if layout is DECODES:  # without trailing rows: the output is the attention's, in order
        batch.query = batch.query[:-2]
        torch.testing.assert_close(
            paged_attention_ref(*batch.args(), budget=budget).float(),
            expected[:-2].float(),
            **tolerance(dtype),
        )


def test_small_budget_splits_into_groups_and_row_chunks():
    batch = make_batch(MIXED, num_heads=4, num_kv_heads=2, head_dim=64, block_size=16)
    meta = batch.meta
    layout = (meta.cu_seqlens_q.tolist(), meta.context_lens.tolist(), meta.block_tables, 16)
    whole = plan_paged_attention(*layout, 4, 2, 64)
    assert len(whole.groups) == 1 and whole.groups[0].max_rows == 40
    small = plan_paged_attention(*layout, 4, 2, 64, budget=2000)
    assert len(small.groups) > 1
    # every group's scores fit; the 40-row prefill is cut into chunks of 2000 // (4 * 40) rows
    assert all(g.size * g.max_rows * 4 * g.max_keys <= 2000 for g in small.groups)
    assert max(g.max_rows for g in small.groups) == 19  # the 19 x 19 prefill fits whole
    assert sorted(g.max_rows for g in small.groups).count(12) >= 3
    # the same plan serves every layer: other queries and caches, the same layout
    other = dataclasses.replace(
        batch,
        query=torch.randn_like(batch.query),
        k_cache=torch.randn_like(batch.k_cache),
        v_cache=torch.randn_like(batch.v_cache),
    )
    for plan in (whole, small):
        for layer in (batch, other):
            torch.testing.assert_close(
                paged_attention_ref(*layer.with_meta(torch_plan=plan).args()), by_definition(layer)
            )


def test_unwritten_slots_never_reach_the_output():
    """Slots past a sequence's context (its last block's tail, other sequences' blocks, the
    padding entries of its table) may hold anything; NaN there must not leak."""
    batch = make_batch([(1, 5), (1, 40), (6, 6)], num_heads=4, num_kv_heads=2, block_size=16)
    expected = by_definition(batch)
    written = torch.zeros(batch.k_cache.shape[:2], dtype=torch.bool)
    for b, context_len in enumerate(batch.meta.context_lens.tolist()):
        for p in range(context_len):
            written[int(batch.meta.block_tables[b, p // 16]), p % 16] = True
    batch.k_cache[~written] = float("nan")
    batch.v_cache[~written] = float("inf")
    actual = paged_attention_ref(*batch.args())
    assert torch.isfinite(actual).all()
    torch.testing.assert_close(actual, expected)
