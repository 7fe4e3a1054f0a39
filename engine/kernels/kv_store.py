"""Triton kernel that writes the new tokens' K/V into the paged cache (``store_kv_ref``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.launch_args import check_kv_caches, unit_stride


@triton.jit
def _store_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_key_token,
    stride_key_head,
    stride_value_token,
    stride_value_head,
    stride_cache_block,
    stride_cache_offset,
    stride_cache_head,
    block_size,
    num_kv_heads,
    head_dim,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
):
    # One program per new token: all its KV heads move in one masked tile.
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // block_size
    offset = slot % block_size
    heads = tl.arange(0, BLOCK_HEADS)
    dims = tl.arange(0, BLOCK_DIM)
    mask = (heads[:, None] < num_kv_heads) & (dims[None, :] < head_dim)

    src_key = key_ptr + token * stride_key_token + heads[:, None] * stride_key_head + dims[None, :]
    src_value = (
        value_ptr + token * stride_value_token + heads[:, None] * stride_value_head + dims[None, :]
    )
    dst = block * stride_cache_block + offset * stride_cache_offset
    dst = dst + heads[:, None] * stride_cache_head + dims[None, :]

    key = tl.load(src_key, mask=mask)
    value = tl.load(src_value, mask=mask)
    tl.store(k_cache_ptr + dst, key.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, value.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]`` into their slots.

    Slot ``-1`` is padding and is skipped. ``key``/``value`` may be strided views (e.g. slices
    of a fused QKV projection) as long as the head dimension is contiguous.
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    if value.shape != key.shape:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} differ")
    check_kv_caches(k_cache, v_cache)
    if k_cache.shape[2:] != (num_kv_heads, head_dim):
        raise ValueError(
            f"cache heads/dim {tuple(k_cache.shape[2:])} do not match key {(num_kv_heads, head_dim)}"
        )
    if slot_mapping.shape != (num_tokens,):
        raise ValueError(f"slot_mapping must be [{num_tokens}], got {tuple(slot_mapping.shape)}")
    if num_tokens == 0:
        return
    key, value = unit_stride(key), unit_stride(value)

    _store_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_cache.shape[1],
        num_kv_heads,
        head_dim,
        BLOCK_HEADS=triton.next_power_of_2(num_kv_heads),
        BLOCK_DIM=triton.next_power_of_2(head_dim),
    )
