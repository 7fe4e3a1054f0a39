"""Kernel dispatch: the torch reference on the CPU, Triton on CUDA, or whichever is forced.

Both backends share one signature per op (see ``reference.py`` for the contract).
"""

from __future__ import annotations

from typing import Literal

import torch

from engine.kernels.reference import (
    AttentionMetadata,
    paged_attention_ref,
    rms_norm_ref,
    rope_ref,
    silu_and_mul_ref,
    store_kv_ref,
)

Backend = Literal["torch", "triton"]


def resolve_backend(requested: str, device: torch.device) -> Backend:
    """``auto`` picks Triton on CUDA and the torch reference elsewhere."""
    if requested == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if requested not in ("torch", "triton"):
        raise ValueError(f"attention_backend must be auto, torch or triton, not {requested!r}")
    return requested  # type: ignore[return-value]


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    backend: Backend = "torch",
    all_slots_valid: bool = False,
) -> None:
    """``all_slots_valid``: no slot is -1 (padding), so the torch path looks for none."""
    if backend == "triton":
        from engine.kernels.kv_store import store_kv_triton

        store_kv_triton(key, value, k_cache, v_cache, slot_mapping)
    else:
        store_kv_ref(key, value, k_cache, v_cache, slot_mapping, all_slots_valid)


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    backend: Backend = "torch",
) -> torch.Tensor:
    """Each backend reads what it needs of ``meta``: Triton its grid size and split count,
    the torch path its per-step plan (see ``AttentionMetadata``)."""
    if backend == "triton":
        from engine.kernels.triton_paged_attention import paged_attention_triton

        return paged_attention_triton(query, k_cache, v_cache, meta, scale)
    return paged_attention_ref(query, k_cache, v_cache, meta, scale)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    backend: Backend = "torch",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm, fused with the residual add when ``residual`` is given (see ``rms_norm_ref``)."""
    if backend == "triton":
        from engine.kernels.triton_rms_norm import rms_norm_triton

        return rms_norm_triton(x, weight, eps, residual)
    return rms_norm_ref(x, weight, eps, residual)


def silu_and_mul(x: torch.Tensor, backend: Backend = "torch") -> torch.Tensor:
    """SwiGLU on a fused gate/up projection (see ``silu_and_mul_ref``)."""
    if backend == "triton":
        from engine.kernels.triton_silu_and_mul import silu_and_mul_triton

        return silu_and_mul_triton(x)
    return silu_and_mul_ref(x)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    backend: Backend = "torch",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate query and key by their positions (see ``rope_ref``)."""
    if backend == "triton":
        from engine.kernels.triton_rope import rope_triton

        return rope_triton(positions, query, key, cos_cache, sin_cache)
    return rope_ref(positions, query, key, cos_cache, sin_cache)
