"""Triton paged attention against the torch reference (interpreter on CPU, native on CUDA)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import paged_attention
from engine.kernels.reference import paged_attention_ref
from engine.kernels.triton_paged_attention import choose_num_kv_splits, paged_attention_triton

from .kernel_cases import KERNEL_DTYPES, AttentionBatch, make_batch, tolerance


def run_both(batch: AttentionBatch, **layout: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton and the reference on ``batch``, its layout changed by ``layout`` (split count)."""
    batch = batch.with_meta(**layout)
    return paged_attention_triton(*batch.args()), paged_attention_ref(*batch.args())


def assert_matches(batch: AttentionBatch, **layout: object) -> torch.Tensor:
    actual, expected = run_both(batch, **layout)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert torch.isfinite(actual.float()).all()
    torch.testing.assert_close(actual.float(), expected.float(), **tolerance(batch.query.dtype))
    return actual


def layout(name: str, seqs: list, num_kv_splits: int | None = None, **shape: int) -> object:
    """A batch layout the kernel must match the reference on: ``(q_len, context_len)`` per
    sequence, the ``make_batch`` shape, and the split count (``None``: the kernel picks)."""
    label = "-".join([name, *(f"{key}={value}" for key, value in shape.items())])
    return pytest.param(seqs, shape, num_kv_splits, id=label)


# (q_len, context_len) of every sequence in each kind of step
DECODES = [(1, 37), (1, 5), (1, 64), (1, 1)]
PREFILLS = [(19, 19), (40, 40), (1, 1)]
# a prefill chunk behind a 50-token cached prefix, a fresh prefill and a decode together
CHUNK_OVER_PREFIX_MIXED = [(21, 71), (9, 9), (1, 45)]
# splits must respect the causal window of each new token, not just the context length
SPLIT_SEVERAL_NEW_TOKENS = [(5, 150), (2, 2), (0, 0)]

LAYOUTS = [
    *(
        layout("decode", DECODES, 1, num_heads=2 * g, num_kv_heads=2, head_dim=d, block_size=b)
        for g in (1, 4, 8)
        for b in (16, 32)
        for d in (64, 128)
    ),
    *(
        layout("prefill", PREFILLS, num_heads=g, num_kv_heads=1, block_size=b)
        for g in (1, 4)
        for b in (16, 32)
    ),
    *(
        layout(
            "chunk_over_prefix", CHUNK_OVER_PREFIX_MIXED, num_heads=8, num_kv_heads=2, block_size=b
        )
        for b in (16, 32)
    ),
    layout("gqa_8_head_dim_128", [(3, 40), (1, 17)], num_heads=8, num_kv_heads=1, head_dim=128),
    layout("split_several_new_tokens", SPLIT_SEVERAL_NEW_TOKENS, 4, num_heads=4, num_kv_heads=2),
]


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize(("seqs", "shape", "num_kv_splits"), LAYOUTS)
def test_matches_reference(dtype, seqs, shape, num_kv_splits, device):
    batch = make_batch(seqs, dtype=dtype, device=device, **shape)
    assert_matches(batch, num_kv_splits=num_kv_splits)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize(("group", "num_splits"), [(1, 3), (4, 4), (8, 5)])
def test_split_kv_decode_matches_reference(dtype, group, num_splits, device):
    batch = make_batch(
        [(1, 300), (1, 7), (1, 129)],
        num_heads=group,
        num_kv_heads=1,
        block_size=32,
        dtype=dtype,
        device=device,
    )
    split = assert_matches(batch, num_kv_splits=num_splits)
    single, _ = run_both(batch, num_kv_splits=1)
    torch.testing.assert_close(split.float(), single.float(), **tolerance(dtype))


@pytest.mark.parametrize("num_splits", [1, 3])
def test_padding_rows_and_trailing_tokens_are_zero(num_splits, device):
    batch = make_batch(
        [(0, 0), (3, 20), (0, 0), (1, 9)],
        num_heads=4,
        num_kv_heads=2,
        device=device,
        trailing_pad_tokens=2,
    )
    out = assert_matches(batch, num_kv_splits=num_splits)
    assert out[-2:].abs().sum().item() == 0.0
    assert out[:4].abs().sum().item() > 0.0


def test_dispatcher_without_max_query_len_syncs_and_matches(device):
    batch = make_batch(
        [(6, 30), (1, 12)], num_heads=4, num_kv_heads=1, dtype=torch.float16, device=device
    )
    batch = batch.with_meta(max_query_len=None)
    expected = paged_attention(*batch.args(), backend="torch")
    actual = paged_attention(*batch.args(), backend="triton")
    torch.testing.assert_close(actual.float(), expected.float(), **tolerance(torch.float16))


def test_strided_query_view_is_accepted(device):
    # The model hands in q as a slice of a fused QKV projection.
    batch = make_batch([(4, 20)], num_heads=2, num_kv_heads=1, device=device)
    fused = torch.cat([batch.query, torch.randn_like(batch.query)], dim=1)
    batch.query = fused[:, :2]
    assert not batch.query.is_contiguous()
    assert_matches(batch)


def test_bad_shapes_get_clear_errors(device):
    three_heads_over_two = make_batch([(1, 10)], num_heads=3, num_kv_heads=2, device=device)
    with pytest.raises(ValueError, match="multiple"):
        paged_attention_triton(*three_heads_over_two.args())
    good = make_batch([(1, 10)], num_heads=2, num_kv_heads=2, device=device)
    short_cu_seqlens = good.with_meta(cu_seqlens_q=good.meta.cu_seqlens_q[:1])
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        paged_attention_triton(*short_cu_seqlens.args())


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_random_ragged_batches(seed, num_splits, device):
    # Decodes, fresh prefills, chunks over a prefix and padding rows, shuffled together.
    generator = torch.Generator().manual_seed(seed)
    seqs = []
    for _ in range(7):
        kind = int(torch.randint(0, 4, (1,), generator=generator))
        prefix = int(torch.randint(0, 90, (1,), generator=generator))
        new = int(torch.randint(1, 40, (1,), generator=generator))
        seqs.append([(1, prefix + 1), (new, new), (new, prefix + new), (0, 0)][kind])
    dtype = KERNEL_DTYPES[seed % len(KERNEL_DTYPES)]
    batch = make_batch(
        seqs,
        num_heads=4,
        num_kv_heads=2,
        head_dim=128 if seed % 2 else 64,
        block_size=[16, 32, 64][seed % 3],
        dtype=dtype,
        device=device,
        seed=seed,
    )
    assert batch.meta.max_query_len > 0, "the seeded draw must hold real rows besides padding"
    assert_matches(batch, num_kv_splits=num_splits)


def test_automatic_split_choice_on_long_contexts(device):
    # Two long decodes leave a GPU mostly idle without splits; the CPU never splits.
    batch = make_batch(
        [(1, 1500), (1, 700)],
        num_heads=4,
        num_kv_heads=1,
        block_size=32,
        dtype=torch.float16,
        device=device,
    )
    max_context = batch.meta.block_tables.shape[1] * batch.k_cache.shape[1]
    splits = choose_num_kv_splits(2, 1, 1, max_context, device)
    if device.type == "cuda":
        assert 1 < splits <= 16
    else:
        assert splits == 1
    assert choose_num_kv_splits(2, 1, 64, max_context, device) == 1  # prefill never splits
    assert_matches(batch)
