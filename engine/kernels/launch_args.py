"""Input checks and layouts that every Triton wrapper applies before it launches a kernel.

The kernels index a tensor's last dimension with unit stride and take K/V caches that share
one layout; these helpers give each wrapper such tensors (copying only what is strided) or
raise ``ValueError`` naming what is wrong.
"""

from __future__ import annotations

import torch


def unit_stride(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when its last dimension is contiguous, else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def as_rows(x: torch.Tensor, width: int) -> torch.Tensor:
    """``x`` as ``[rows, width]`` with a contiguous last dimension."""
    return unit_stride(x.reshape(-1, width))


def check_kv_caches(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """One layout for both caches (the kernels share their strides), ``head_dim`` contiguous."""
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must share shape and layout")
    if k_cache.stride(-1) != 1:
        raise ValueError("the KV cache's head_dim must be contiguous")
