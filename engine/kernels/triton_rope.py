"""Triton rotary embedding for query and key in one launch (contract: ``reference.rope_ref``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.launch_args import unit_stride


@triton.jit
def _rotate_heads(
    src_ptr,
    dst_ptr,
    token,
    stride_src_token,
    stride_src_head,
    stride_dst_token,
    stride_dst_head,
    num_heads,
    cos,
    sin,
    half,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    heads = tl.arange(0, BLOCK_HEADS)
    cols = tl.arange(0, BLOCK_HALF)
    mask = (heads[:, None] < num_heads) & (cols[None, :] < half)
    src = src_ptr + token * stride_src_token + heads[:, None] * stride_src_head + cols[None, :]
    dst = dst_ptr + token * stride_dst_token + heads[:, None] * stride_dst_head + cols[None, :]
    first = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    second = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
    out_type = dst_ptr.dtype.element_ty
    tl.store(dst, (first * cos[None, :] - second * sin[None, :]).to(out_type), mask=mask)
    tl.store(dst + half, (second * cos[None, :] + first * sin[None, :]).to(out_type), mask=mask)


@triton.jit
def _rope_kernel(
    positions_ptr,
    query_ptr,
    key_ptr,
    query_out_ptr,
    key_out_ptr,
    cos_ptr,
    sin_ptr,
    stride_q_token,
    stride_q_head,
    stride_k_token,
    stride_k_head,
    stride_qo_token,
    stride_qo_head,
    stride_ko_token,
    stride_ko_head,
    stride_cache,
    num_heads,
    num_kv_heads,
    half,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_KV_HEADS: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    # One program per token: its cos/sin row is read once for all query and key heads.
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    cols = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cos_ptr + position * stride_cache + cols, mask=cols < half, other=0.0)
    sin = tl.load(sin_ptr + position * stride_cache + cols, mask=cols < half, other=0.0)
    cos = cos.to(tl.float32)
    sin = sin.to(tl.float32)
    _rotate_heads(
        query_ptr,
        query_out_ptr,
        token,
        stride_q_token,
        stride_q_head,
        stride_qo_token,
        stride_qo_head,
        num_heads,
        cos,
        sin,
        half,
        BLOCK_HEADS,
        BLOCK_HALF,
    )
    _rotate_heads(
        key_ptr,
        key_out_ptr,
        token,
        stride_k_token,
        stride_k_head,
        stride_ko_token,
        stride_ko_head,
        num_kv_heads,
        cos,
        sin,
        half,
        BLOCK_KV_HEADS,
        BLOCK_HALF,
    )


def rope_triton(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``query`` ``[T, H, D]`` and ``key`` ``[T, KVH, D]`` (NeoX halves layout).

    ``cos_cache``/``sin_cache`` are ``[max_position, D / 2]``; returns new tensors.
    """
    num_tokens, num_heads, head_dim = query.shape
    if key.dim() != 3 or key.shape[0] != num_tokens or key.shape[2] != head_dim:
        raise ValueError(f"key {tuple(key.shape)} does not match query {tuple(query.shape)}")
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for rotary embeddings, got {head_dim}")
    half = head_dim // 2
    if cos_cache.shape != sin_cache.shape or cos_cache.dim() != 2 or cos_cache.shape[1] != half:
        raise ValueError(f"cos/sin caches must both be [max_position, {half}]")
    if positions.shape != (num_tokens,):
        raise ValueError(f"positions must be [{num_tokens}], got {tuple(positions.shape)}")
    query, key = unit_stride(query), unit_stride(key)
    cos_cache, sin_cache = cos_cache.contiguous(), sin_cache.contiguous()
    query_out = torch.empty_like(query, memory_format=torch.contiguous_format)
    key_out = torch.empty_like(key, memory_format=torch.contiguous_format)
    if num_tokens == 0:
        return query_out, key_out
    _rope_kernel[(num_tokens,)](
        positions,
        query,
        key,
        query_out,
        key_out,
        cos_cache,
        sin_cache,
        query.stride(0),
        query.stride(1),
        key.stride(0),
        key.stride(1),
        query_out.stride(0),
        query_out.stride(1),
        key_out.stride(0),
        key_out.stride(1),
        cos_cache.stride(0),
        num_heads,
        key.shape[1],
        half,
        BLOCK_HEADS=triton.next_power_of_2(num_heads),
        BLOCK_KV_HEADS=triton.next_power_of_2(key.shape[1]),
        BLOCK_HALF=triton.next_power_of_2(half),
    )
    return query_out, key_out
