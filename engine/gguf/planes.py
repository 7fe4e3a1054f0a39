"""GGUF quantized blocks as a `QuantizedWeight` (codes, scale and offset per group), unrounded.

Each type's decoder in `engine.gguf.dequant` computes `scale * q + offset` (or `scale * q`) in
float32; here the same scale and offset are kept per group and q is shifted to an unsigned
code, so `QuantizedWeight.dequantize()` gives exactly the values `dequantize()` does (the
tests compare them bit for bit). Q4_0, Q4_1 and Q4_K keep 4-bit codes; the others (Q8_0,
Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, Q6_K) one code per byte.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.gguf.dequant import (
    BLOCK_LAYOUT,
    QK,
    QK_K,
    bit_fields,
    block_f16,
    fifth_bits,
    k_scale_min,
    low_then_high_nibbles,
)
from engine.quant.weight import QuantizedWeight, pack_nibbles

# (codes [n, values], scale [n, groups], offset [n, groups], bits, group size)
Planes = tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]


def _q4_0(b: torch.Tensor) -> Planes:
    d = block_f16(b, 0)
    return b[:, 2:], d, -8.0 * d, 4, QK


def _q4_1(b: torch.Tensor) -> Planes:
    return b[:, 4:], block_f16(b, 0), block_f16(b, 2), 4, QK


def _q8_0(b: torch.Tensor) -> Planes:
    d = block_f16(b, 0)
    codes = (b[:, 2:].contiguous().view(torch.int8).to(torch.int16) + 128).to(torch.uint8)
    return codes, d, -128.0 * d, 8, QK


def _q5_0(b: torch.Tensor) -> Planes:
    d = block_f16(b, 0)
    return low_then_high_nibbles(b[:, 6:]) | (fifth_bits(b[:, 2:6]) << 4), d, -16.0 * d, 8, QK


def _q5_1(b: torch.Tensor) -> Planes:
    codes = low_then_high_nibbles(b[:, 8:]) | (fifth_bits(b[:, 4:8]) << 4)
    return codes, block_f16(b, 0), block_f16(b, 2), 8, QK


def _q2_k(b: torch.Tensor) -> Planes:
    n = b.shape[0]
    scales = b[:, :16]
    d, dmin = block_f16(b, 80), block_f16(b, 82)
    codes = bit_fields(b[:, 16:80].view(n, 2, 32), 2).reshape(n, QK_K)
    return codes, d * (scales & 0x0F).float(), -(dmin * (scales >> 4).float()), 8, 16


def _q3_k(b: torch.Tensor) -> Planes:
    n = b.shape[0]
    hmask, qs, packed = b[:, :32], b[:, 32:96], b[:, 96:108]
    low = low_then_high_nibbles(packed[:, :8])
    high = bit_fields(packed[:, 8:12], 2).reshape(n, 16)
    scale = block_f16(b, 108) * ((low | (high << 4)).to(torch.int8) - 32).float()
    ql = bit_fields(qs.view(n, 2, 32), 2).reshape(n, QK_K)
    high_bit = bit_fields(hmask, 1).reshape(n, QK_K)  # set: +0, clear: -4; code = q + 4
    return ql + (high_bit << 2), scale, -4.0 * scale, 8, 16


def _q4_k(b: torch.Tensor) -> Planes:
    n = b.shape[0]
    scales, mins = k_scale_min(b[:, 4:16])
    codes = low_then_high_nibbles(b[:, 16:].reshape(n, 4, 32)).reshape(n, QK_K)
    return pack_nibbles(codes), block_f16(b, 0) * scales, -(block_f16(b, 2) * mins), 4, QK


def _q5_k(b: torch.Tensor) -> Planes:
    n = b.shape[0]
    scales, mins = k_scale_min(b[:, 4:16])
    high = bit_fields(b[:, 16:48], 1).view(n, QK_K)
    low = low_then_high_nibbles(b[:, 48:].reshape(n, 4, 32)).reshape(n, QK_K)
    return low | (high << 4), block_f16(b, 0) * scales, -(block_f16(b, 2) * mins), 8, QK


def _q6_k(b: torch.Tensor) -> Planes:
    n = b.shape[0]
    low = low_then_high_nibbles(b[:, :128].reshape(n, 2, 64)).reshape(n, QK_K)
    high = bit_fields(b[:, 128:192].reshape(n, 2, 32), 2).reshape(n, QK_K)
    scale = block_f16(b, 208) * b[:, 192:208].contiguous().view(torch.int8).float()
    return low | (high << 4), scale, -32.0 * scale, 8, 16


_PLANES: dict[str, Callable[[torch.Tensor], Planes]] = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q8_0": _q8_0,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}

KEPT_TYPES = tuple(_PLANES)


def quantized_weight(raw: torch.Tensor, type_name: str, shape: tuple[int, int]) -> QuantizedWeight:
    """The 2-D GGUF tensor `raw` (its bytes) of type `type_name` as a `QuantizedWeight`."""
    rows, cols = shape
    block_bytes, _ = BLOCK_LAYOUT[type_name]
    blocks = raw.reshape(-1, block_bytes)
    codes, scale, offset, bits, group = _PLANES[type_name](blocks)
    per_row = cols // 2 if bits == 4 else cols
    return QuantizedWeight(
        codes.contiguous().view(torch.uint8).reshape(rows, per_row),
        scale.reshape(rows, cols // group).contiguous(),
        offset.reshape(rows, cols // group).contiguous(),
        bits,
        group,
        type_name,
    )
