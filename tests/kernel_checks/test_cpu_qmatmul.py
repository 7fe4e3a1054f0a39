"""The C kernels for quantized weights (engine/kernels/cpu/qmatmul.c) against the torch
reference, `F.linear` on `QuantizedWeight.dequantize()`: random codes with the edge values
(0 and the largest code in whole groups), zero, negative and large scales, every row count a
tile can end on, 4- and 8-bit codes, the group sizes the formats use, one and two threads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.kernels.cpu.build import CpuKernels, load_kernels
from engine.quant.weight import QuantizedWeight, concat_rows, pack_nibbles, unpack_nibbles

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> CpuKernels:
    built, why = load_kernels(tmp_path_factory.mktemp("kernels"))
    assert built is not None, why
    return built


def random_weight(rows: int, cols: int, bits: int, group: int, seed: int) -> QuantizedWeight:
    generator = torch.Generator().manual_seed(seed)
    top = (1 << bits) - 1
    codes = torch.randint(0, top + 1, (rows, cols), generator=generator, dtype=torch.uint8)
    codes[0, :group] = 0  # edge values: a group of the smallest and one of the largest code
    codes[-1, -group:] = top
    groups = cols // group
    scales = torch.randn(rows, groups, generator=generator) * 0.02
    offsets = torch.randn(rows, groups, generator=generator) * 0.1
    scales[0, 0] = 0.0  # a zero scale
    scales[-1, -1] = -3e4  # a large negative one
    offsets[-1, 0] = 5e3
    stored = pack_nibbles(codes) if bits == 4 else codes
    return QuantizedWeight(stored, scales, offsets, bits, group, "test")


def test_nibble_packing_round_trips_in_ggufs_order() -> None:
    codes = torch.randint(0, 16, (2, 64), dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.shape == (2, 32)
    assert packed[1, 0] == codes[1, 0] | codes[1, 16] << 4  # value j low, value j + 16 high
    assert packed[1, 17] == codes[1, 33] | codes[1, 49] << 4
    assert torch.equal(unpack_nibbles(packed), codes)


@pytest.mark.parametrize(("bits", "group"), [(4, 32), (4, 128), (8, 16), (8, 32), (8, 64)])
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 17])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_kernel_equals_dequantize_then_f_linear(
    kernels: CpuKernels, bits: int, group: int, rows: int, threads: int
) -> None:
    weight = random_weight(40, 256, bits, group, seed=rows * 7 + bits)
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)) * 3
    expected = F.linear(x, weight.dequantize())
    got = kernels.linear(x, weight, threads)
    # the same products summed in another order: float32 rounding only
    scale = float(expected.abs().max())
    assert float((got - expected).abs().max()) <= 2e-6 * scale
    assert got.shape == (rows, 40)


def test_leading_dims_and_a_strided_input_are_accepted(kernels: CpuKernels) -> None:
    weight = random_weight(24, 64, 4, 32, seed=1)
    x = torch.randn(2, 3, 128, generator=torch.Generator().manual_seed(1))[..., ::2]
    assert not x.is_contiguous()
    expected = F.linear(x, weight.dequantize())
    got = kernels.linear(x, weight, 1)
    assert got.shape == (2, 3, 24)
    # Bounded by the largest output, as above: the large scale's products cancel in some rows,
    # so an elementwise relative bound failed on 89 of 3,000 random inputs (float32 rounding,
    # never more than 5.7e-7 of the largest output).
    assert float((got - expected).abs().max()) <= 2e-6 * float(expected.abs().max())


@pytest.mark.parametrize(("bits", "group"), [(4, 32), (8, 16)])
def test_dequantized_rows_are_the_reference_bit_for_bit(
    kernels: CpuKernels, bits: int, group: int
) -> None:
    weight = random_weight(50, 96, bits, group, seed=5)
    ids = torch.tensor([49, 0, 7, 7, 31])
    assert torch.equal(kernels.dequantize(weight, ids, 1), weight.dequantize(ids))
    assert torch.equal(kernels.dequantize(weight, None, 2), weight.dequantize())


def test_a_shape_the_layout_cannot_hold_is_refused(kernels: CpuKernels) -> None:
    weight = random_weight(4, 64, 8, 16, seed=2)
    x, out = torch.zeros(1, 64), torch.empty(1, 4)
    planes = (weight.codes.data_ptr(), weight.scales.data_ptr(), weight.offsets.data_ptr())
    # K = 60 does not divide into groups of 16; 4-bit codes need groups of 32
    assert kernels.library.sy_qlinear(1, 4, 60, 16, 8, x.data_ptr(), *planes, out.data_ptr(), 1)
    assert kernels.library.sy_qlinear(1, 4, 64, 16, 4, x.data_ptr(), *planes, out.data_ptr(), 1)


def test_unlike_parts_fuse_into_one_layout_with_the_same_values() -> None:
    q4 = random_weight(8, 64, 4, 32, seed=3)
    q8 = random_weight(4, 64, 8, 16, seed=4)
    fused = concat_rows([q4, q8])
    assert (fused.bits, fused.group_size) == (8, 16)
    assert torch.equal(fused.dequantize(), torch.cat([q4.dequantize(), q8.dequantize()]))


def test_no_compiler_means_no_kernels_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    built, why = load_kernels(tmp_path / "cache")
    assert built is None and "no C compiler" in why


def test_a_build_is_cached_per_source_and_machine(tmp_path: Path) -> None:
    first, _ = load_kernels(tmp_path)
    second, _ = load_kernels(tmp_path)
    assert first is not None and second is not None
    assert first.path == second.path and len(list(tmp_path.glob("qmatmul-*.so"))) == 1
