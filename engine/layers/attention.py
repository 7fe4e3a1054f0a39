"""Paged attention layer: store this step's K/V into the cache, then attend over it.

Prefill, decode and chunked prefill over a cached prefix are one code path; the batch
layout is described by `AttentionMetadata` (see `engine/kernels/reference.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine import kernels
from engine.kernels.reference import PagedAttentionPlan


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 = padding
    cu_seqlens_q: torch.Tensor  # [B + 1] int32
    context_lens: torch.Tensor  # [B] int32, KV entries including the new tokens
    block_tables: torch.Tensor  # [B, max_blocks] int32
    max_query_len: int | None = None
    num_kv_splits: int | None = None  # flash-decoding splits (Triton); None: the kernel picks
    torch_plan: PagedAttentionPlan | None = None  # the torch path's layout, once per step


class Attention(nn.Module):
    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        backend: kernels.Backend = "torch",
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.backend = backend
        # The runner binds this layer's slice of the KV pool; None until then.
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata | None
    ) -> torch.Tensor:
        """`q` `[T, heads, head_dim]`, `k`/`v` `[T, kv_heads, head_dim]` -> `[T, heads * head_dim]`."""
        if self.k_cache is None or self.v_cache is None or meta is None:
            raise RuntimeError("attention runs on the paged KV cache: bind it and pass metadata")
        kernels.store_kv(
            k.contiguous(),
            v.contiguous(),
            self.k_cache,
            self.v_cache,
            meta.slot_mapping,
            self.backend,
        )
        out = kernels.paged_attention(
            q.contiguous(),
            self.k_cache,
            self.v_cache,
            meta.block_tables,
            meta.cu_seqlens_q,
            meta.context_lens,
            self.scale,
            backend=self.backend,
            max_query_len=meta.max_query_len,
            num_kv_splits=meta.num_kv_splits,
            plan=meta.torch_plan,
        )
        return out.reshape(out.shape[0], -1)
