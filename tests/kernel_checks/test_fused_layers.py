"""Fused RMSNorm(+residual), SiLU·mul and RoPE kernels against their torch references."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import rms_norm, rotary_embedding, silu_and_mul
from engine.kernels.reference import rms_norm_ref, rope_ref, silu_and_mul_ref
from engine.kernels.triton_rms_norm import rms_norm_triton
from engine.kernels.triton_rope import rope_triton
from engine.kernels.triton_silu_and_mul import silu_and_mul_triton

from .kernel_cases import KERNEL_DTYPES, tolerance


def random(shape, dtype, device, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator).to(dtype).to(device)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("hidden_size", [64, 96, 1024])
def test_rms_norm_matches_reference(dtype, hidden_size, device):
    x = random((5, 3, hidden_size), dtype, device)
    weight = random((hidden_size,), dtype, device, seed=1)
    actual = rms_norm_triton(x, weight, 1e-6)
    expected = rms_norm_ref(x, weight, 1e-6)
    assert actual.shape == x.shape and actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, **tolerance(dtype))


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_rms_norm_with_residual_returns_the_sum(dtype, device):
    x = random((7, 256), dtype, device)
    residual = random((7, 256), dtype, device, seed=2)
    weight = random((256,), dtype, device, seed=3)
    out, new_residual = rms_norm(x, weight, 1e-5, residual, backend="triton")
    expected_out, expected_residual = rms_norm_ref(x, weight, 1e-5, residual)
    torch.testing.assert_close(new_residual, expected_residual, atol=0, rtol=0)
    torch.testing.assert_close(out, expected_out, **tolerance(dtype))


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("width", [48, 3072])
def test_silu_and_mul_matches_reference(dtype, width, device):
    x = random((4, 2, 2 * width), dtype, device)
    actual = silu_and_mul(x, backend="triton")
    expected = silu_and_mul_ref(x)
    assert actual.shape == (4, 2, width)
    torch.testing.assert_close(actual, expected, **tolerance(dtype))


def test_fused_layers_reject_bad_shapes(device):
    x = random((2, 10), torch.float32, device)
    with pytest.raises(ValueError, match="even"):
        silu_and_mul_triton(x[:, :9])
    with pytest.raises(ValueError, match="weight"):
        rms_norm_triton(x, torch.ones(9, device=device), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        rms_norm_triton(x, torch.ones(10, device=device), 1e-6, residual=x[:1])


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(4, 2, 64), (6, 1, 128)])
def test_rope_matches_reference_and_the_model_layer(
    dtype, num_heads, num_kv_heads, head_dim, device
):
    from engine.layers.rotary import RotaryEmbedding

    layer = RotaryEmbedding(head_dim, max_position=256, base=10000.0).to(device)
    positions = torch.tensor([0, 5, 255, 17, 17, 3], device=device)
    query = random((6, num_heads, head_dim), dtype, device, seed=4)
    key = random((6, num_kv_heads, head_dim), dtype, device, seed=5)
    q_out, k_out = rotary_embedding(
        positions, query, key, layer.cos_cache, layer.sin_cache, backend="triton"
    )
    q_ref, k_ref = rope_ref(positions, query, key, layer.cos_cache, layer.sin_cache)
    q_layer, k_layer = layer(positions, query, key)
    torch.testing.assert_close(q_ref, q_layer, atol=0, rtol=0)
    torch.testing.assert_close(k_ref, k_layer, atol=0, rtol=0)
    torch.testing.assert_close(q_out, q_ref, **tolerance(dtype))
    torch.testing.assert_close(k_out, k_ref, **tolerance(dtype))


def test_rope_rejects_mismatched_shapes(device):
    query = random((3, 2, 64), torch.float32, device)
    cache = random((16, 32), torch.float32, device)
    positions = torch.arange(3, device=device)
    with pytest.raises(ValueError, match="key"):
        rope_triton(positions, query, query[:2], cache, cache)
    with pytest.raises(ValueError, match="caches"):
        rope_triton(positions, query, query, cache[:, :16], cache[:, :16])
    with pytest.raises(ValueError, match="positions"):
        rope_triton(positions[:2], query, query, cache, cache)
