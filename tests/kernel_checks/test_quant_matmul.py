"""The Triton dequantize-in-the-matmul kernel against its torch reference (the dequantized
weight, then `F.linear` in float32): 4- and 8-bit codes, groups of 16 to 128, row counts that
end tiles anywhere, float32 and float16 activations (and bfloat16 on CUDA)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.triton_quant_matmul import quant_linear_ref, quant_linear_triton
from engine.quant.weight import QuantizedWeight, pack_nibbles

from .kernel_cases import KERNEL_DTYPES, tolerance


def random_weight(rows: int, cols: int, bits: int, group: int, device) -> QuantizedWeight:
    generator = torch.Generator().manual_seed(rows + cols + bits + group)
    top = (1 << bits) - 1
    codes = torch.randint(0, top + 1, (rows, cols), generator=generator, dtype=torch.uint8)
    codes[0, :group] = top  # edge codes in whole groups
    codes[-1, -group:] = 0
    scales = torch.randn(rows, cols // group, generator=generator) * 0.02
    offsets = torch.randn(rows, cols // group, generator=generator) * 0.1
    scales[0, 0] = 0.0
    stored = pack_nibbles(codes) if bits == 4 else codes
    return QuantizedWeight(stored, scales, offsets, bits, group, "test").to(device)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize(("bits", "group"), [(4, 32), (4, 128), (8, 16), (8, 32)])
@pytest.mark.parametrize("rows", [1, 5, 33])
def test_quant_linear_matches_reference(dtype, bits, group, rows, device):
    weight = random_weight(72, 256, bits, group, device)
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).to(dtype)
    x = x.to(device)
    actual = quant_linear_triton(x, weight)
    expected = quant_linear_ref(x, weight)
    assert actual.shape == (rows, 72) and actual.dtype == dtype
    torch.testing.assert_close(actual, expected, **tolerance(dtype))


def test_quant_linear_keeps_leading_dims_and_refuses_a_wrong_width(device):
    weight = random_weight(40, 64, 4, 32, device)
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(3)).to(device)
    actual = quant_linear_triton(x, weight)
    torch.testing.assert_close(actual, quant_linear_ref(x, weight), **tolerance(torch.float32))
    with pytest.raises(ValueError, match="inputs"):
        quant_linear_triton(torch.randn(2, 63).to(device), weight)
