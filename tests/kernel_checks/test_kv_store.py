"""Triton KV store against the torch reference."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import store_kv
from engine.kernels.kv_store import store_kv_triton
from engine.kernels.reference import store_kv_ref

from .kernel_cases import KERNEL_DTYPES


def make_store_inputs(dtype, device, num_kv_heads=2, head_dim=64, block_size=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    num_blocks, num_tokens = 6, 23
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(cache_shape, generator=generator).to(dtype).to(device)
    v_cache = torch.randn(cache_shape, generator=generator).to(dtype).to(device)
    key = torch.randn((num_tokens, num_kv_heads, head_dim), generator=generator).to(dtype)
    value = torch.randn((num_tokens, num_kv_heads, head_dim), generator=generator).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=generator)[:num_tokens]
    slots[[0, 5, 22]] = -1  # padding tokens
    return key.to(device), value.to(device), k_cache, v_cache, slots.to(device)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize(("num_kv_heads", "head_dim", "block_size"), [(2, 64, 16), (3, 128, 32)])
def test_store_kv_matches_reference(dtype, num_kv_heads, head_dim, block_size, device):
    key, value, k_cache, v_cache, slots = make_store_inputs(
        dtype, device, num_kv_heads, head_dim, block_size
    )
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    store_kv_ref(key, value, k_expected, v_expected, slots)
    untouched_before = k_cache.clone()
    store_kv_triton(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_expected)
    assert torch.equal(v_cache, v_expected)
    # The store really wrote something, and padding slots changed nothing else.
    assert not torch.equal(k_cache, untouched_before)


def test_store_kv_from_strided_views_via_dispatcher(device):
    key, value, k_cache, v_cache, slots = make_store_inputs(torch.float16, device)
    fused = torch.cat([key, value], dim=1)  # [tokens, 2 * heads, dim], like a fused KV output
    key_view, value_view = fused[:, :2], fused[:, 2:]
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    store_kv_ref(key, value, k_expected, v_expected, slots)
    store_kv(key_view, value_view, k_cache, v_cache, slots, backend="triton")
    assert torch.equal(k_cache, k_expected)
    assert torch.equal(v_cache, v_expected)


def test_store_kv_casts_to_cache_dtype(device):
    key, value, k_cache, v_cache, slots = make_store_inputs(torch.float32, device)
    k_cache, v_cache = k_cache.half(), v_cache.half()
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    store_kv_ref(key, value, k_expected, v_expected, slots)
    store_kv_triton(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_expected)
    assert torch.equal(v_cache, v_expected)


def test_store_kv_rejects_mismatched_shapes(device):
    key, value, k_cache, v_cache, slots = make_store_inputs(torch.float32, device)
    with pytest.raises(ValueError, match="slot_mapping"):
        store_kv_triton(key, value, k_cache, v_cache, slots[:-1])
    with pytest.raises(ValueError, match="cache heads"):
        store_kv_triton(key[:, :1], value[:, :1], k_cache, v_cache, slots)
