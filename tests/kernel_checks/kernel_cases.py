"""Builders of random paged-attention batches shared by the kernel tests."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from engine.kernels.reference import AttentionMetadata

HAS_CUDA = torch.cuda.is_available()
CPU = torch.device("cpu")
# The interpreter computes with numpy, which has no bfloat16.
KERNEL_DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if HAS_CUDA else [])


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """fp32 matches up to summation order; 16-bit loses bits where P is cast for P·V."""
    if dtype == torch.float32:
        return {"atol": 2e-4, "rtol": 2e-4}
    if dtype == torch.float16:
        return {"atol": 5e-3, "rtol": 5e-3}
    return {"atol": 3e-2, "rtol": 3e-2}


@dataclass
class AttentionBatch:
    query: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    meta: AttentionMetadata
    scale: float

    def args(self) -> tuple:
        """The positional arguments every paged attention takes (reference, Triton, dispatch)."""
        return (self.query, self.k_cache, self.v_cache, self.meta, self.scale)

    def with_meta(self, **changes: object) -> AttentionBatch:
        """The same tensors under a changed layout (split count, plan, a broken field)."""
        return dataclasses.replace(self, meta=dataclasses.replace(self.meta, **changes))


def make_batch(
    seqs: list[tuple[int, int]],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int = 64,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    device: torch.device = CPU,
    trailing_pad_tokens: int = 0,
    seed: int = 0,
) -> AttentionBatch:
    """``seqs`` lists ``(q_len, context_len)``; ``(0, 0)`` is a padding row. Unless told
    otherwise: 64-dim heads, 16-token blocks, float32, on the CPU.

    Physical blocks are handed out in shuffled order so the kernel must follow the table.
    """
    generator = torch.Generator().manual_seed(seed)
    blocks_per_seq = [(ctx + block_size - 1) // block_size for _, ctx in seqs]
    max_blocks = max(1, *blocks_per_seq)
    num_blocks = sum(blocks_per_seq) + 3  # spare blocks hold garbage the kernel must not read
    order = torch.randperm(num_blocks, generator=generator)
    block_tables = torch.zeros((len(seqs), max_blocks), dtype=torch.int32)
    used = 0
    for row, count in enumerate(blocks_per_seq):
        block_tables[row, :count] = order[used : used + count]
        used += count

    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(cache_shape, generator=generator).to(dtype)
    v_cache = torch.randn(cache_shape, generator=generator).to(dtype)
    q_lens = [q for q, _ in seqs]
    num_tokens = sum(q_lens) + trailing_pad_tokens
    query = torch.randn((num_tokens, num_heads, head_dim), generator=generator).to(dtype)
    cu_seqlens_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    context_lens = torch.tensor([ctx for _, ctx in seqs], dtype=torch.int32)
    # the new tokens' own slots: the last q_len positions of each context
    slots = [
        int(block_tables[b, p // block_size]) * block_size + p % block_size
        for b, (q_len, ctx) in enumerate(seqs)
        for p in range(ctx - q_len, ctx)
    ]
    slot_mapping = torch.tensor(slots + [-1] * trailing_pad_tokens, dtype=torch.int64)
    meta = AttentionMetadata(
        slot_mapping=slot_mapping.to(device),
        cu_seqlens_q=cu_seqlens_q.to(device),
        context_lens=context_lens.to(device),
        block_tables=block_tables.to(device),
        max_query_len=max(q_lens),
    )
    return AttentionBatch(
        query=query.to(device),
        k_cache=k_cache.to(device),
        v_cache=v_cache.to(device),
        meta=meta,
        scale=head_dim**-0.5,
    )
