"""Paged attention layer: store this step's K/V into the cache, then attend over it.

Prefill, decode and chunked prefill over a cached prefix are one code path; the batch
layout is described by `AttentionMetadata` (see `engine/kernels/reference.py`).
"""

from __future__ import annotations

import torch
from torch import nn

from engine import kernels
from engine.kernels.reference import AttentionMetadata


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
            meta.all_slots_valid,
        )
        out = kernels.paged_attention(
            q.contiguous(), self.k_cache, self.v_cache, meta, self.scale, self.backend
        )
        return out.reshape(out.shape[0], -1)
