"""GGML tensor types to float32, vectorized in torch.

`dequantize(raw, type_name, shape)` takes a tensor's raw bytes as GGUF stores them (rows of
blocks) and returns a float32 tensor of `shape` (torch order: rows, columns). Implemented here:
F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, each
with the operation order of ggml's reference `dequantize_row_*`, so the floats are the same bit
for bit (tests compare every type against the `gguf` package's numpy code). Any other type the
`gguf` package can read (the IQ and TQ families) goes through its numpy `dequantize`; a type
neither knows is a `LoaderError`. Bytes run on whatever device `raw` is on: on CUDA the work
happens there.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from engine.errors import LoaderError

QK = 32  # values per block of the legacy types
QK_K = 256  # values per super-block of the K-quants

# bytes per block, values per block
BLOCK_LAYOUT: dict[str, tuple[int, int]] = {
    "F32": (4, 1),
    "F16": (2, 1),
    "BF16": (2, 1),
    "Q8_0": (2 + QK, QK),
    "Q4_0": (2 + QK // 2, QK),
    "Q4_1": (4 + QK // 2, QK),
    "Q5_0": (2 + 4 + QK // 2, QK),
    "Q5_1": (4 + 4 + QK // 2, QK),
    "Q2_K": (QK_K // 16 + QK_K // 4 + 4, QK_K),
    "Q3_K": (QK_K // 8 + QK_K // 4 + 12 + 2, QK_K),
    "Q4_K": (4 + 12 + QK_K // 2, QK_K),
    "Q5_K": (4 + 12 + QK_K // 8 + QK_K // 2, QK_K),
    "Q6_K": (QK_K // 2 + QK_K // 4 + QK_K // 16 + 2, QK_K),
}


def block_f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 at byte `start` of every block, as a float32 column."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def low_then_high_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[n, k] bytes -> [n, 2k]: all low nibbles first, then all high nibbles (ggml's order)."""
    return torch.cat([packed & 0x0F, packed >> 4], dim=-1)


def bit_fields(packed: torch.Tensor, width: int) -> torch.Tensor:
    """[n, k] bytes -> [n, 8/width, k]: field i of every byte is bits [i*width, (i+1)*width)."""
    shifts = torch.arange(0, 8, width, dtype=torch.uint8, device=packed.device)
    mask = (1 << width) - 1
    return (packed.unsqueeze(-2) >> shifts.view(-1, 1)) & mask


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].contiguous().view(torch.int8).float() * block_f16(b, 0)


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    q = low_then_high_nibbles(b[:, 2:]).to(torch.int8) - 8
    return block_f16(b, 0) * q.float()


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    return block_f16(b, 0) * low_then_high_nibbles(b[:, 4:]).float() + block_f16(b, 2)


def fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0/Q5_1: 4 bytes, bit j (little-endian) is the fifth bit of value j."""
    return bit_fields(qh, 1).transpose(-1, -2).reshape(qh.shape[0], QK)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    q = low_then_high_nibbles(b[:, 6:]) | (fifth_bits(b[:, 2:6]) << 4)
    return block_f16(b, 0) * (q.to(torch.int8) - 16).float()


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    q = low_then_high_nibbles(b[:, 8:]) | (fifth_bits(b[:, 4:8]) << 4)
    return block_f16(b, 0) * q.float() + block_f16(b, 2)


def k_scale_min(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit mins."""
    low, high, extra = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat([low & 0x3F, (extra & 0x0F) | ((low >> 2) & 0x30)], dim=-1)
    mins = torch.cat([high & 0x3F, (extra >> 4) | ((high >> 2) & 0x30)], dim=-1)
    return scales.float(), mins.float()


def _q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales, qs = b[:, :16], b[:, 16:80]
    d, dmin = block_f16(b, 80), block_f16(b, 82)
    dl = (d * (scales & 0x0F).float()).view(n, 16, 1)
    ml = (dmin * (scales >> 4).float()).view(n, 16, 1)
    # two halves of 32 bytes; in each, 2-bit field i of byte j is value 32*i + j
    q = bit_fields(qs.view(n, 2, 32), 2).reshape(n, 16, 16).float()
    return (dl * q - ml).view(n, QK_K)


def _q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    hmask, qs, packed = b[:, :32], b[:, 32:96], b[:, 96:108]
    d = block_f16(b, 108)
    low = low_then_high_nibbles(packed[:, :8])  # 16 low 4-bit parts
    high = bit_fields(packed[:, 8:12], 2).reshape(n, 16)  # 16 high 2-bit parts
    scales = ((low | (high << 4)).to(torch.int8) - 32).float()
    dl = (d * scales).view(n, 16, 1)
    ql = bit_fields(qs.view(n, 2, 32), 2).reshape(n, 16, 16)
    # the high bit is a *minus four* when the mask bit is clear
    qh = bit_fields(hmask, 1).reshape(n, 16, 16) ^ 1
    q = (ql.to(torch.int8) - (qh << 2).to(torch.int8)).float()
    return (dl * q).view(n, QK_K)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d, dmin = block_f16(b, 0), block_f16(b, 2)
    scales, mins = k_scale_min(b[:, 4:16])
    q = low_then_high_nibbles(b[:, 16:].reshape(n, 4, 32)).view(n, 8, 32).float()
    return ((d * scales).view(n, 8, 1) * q - (dmin * mins).view(n, 8, 1)).view(n, QK_K)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d, dmin = block_f16(b, 0), block_f16(b, 2)
    scales, mins = k_scale_min(b[:, 4:16])
    qh = bit_fields(b[:, 16:48], 1).view(n, 8, 32)  # bit i of byte j: fifth bit of value 32*i + j
    ql = low_then_high_nibbles(b[:, 48:].reshape(n, 4, 32)).view(n, 8, 32)
    q = (ql | (qh << 4)).float()
    return ((d * scales).view(n, 8, 1) * q - (dmin * mins).view(n, 8, 1)).view(n, QK_K)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql, qh = b[:, :128], b[:, 128:192]
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    d = (block_f16(b, 208) * scales).view(n, 16, 1)
    low = low_then_high_nibbles(ql.reshape(n, 2, 64)).view(n, 8, 32)
    high = bit_fields(qh.reshape(n, 2, 32), 2).reshape(n, 8, 32)
    q = ((low | (high << 4)).to(torch.int8) - 32).view(n, 16, 16).float()
    return (d * q).view(n, QK_K)


_BLOCK_DECODERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Q8_0": _q8_0,
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}

NATIVE_TYPES = ("F32", "F16", "BF16", *_BLOCK_DECODERS)


def dequantize(raw: torch.Tensor, type_name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The float32 values of one tensor of GGML type `type_name` (see the module docstring)."""
    numel = 1
    for size in shape:
        numel *= size
    if type_name in ("F32", "F16", "BF16"):
        dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[type_name]
        return raw.reshape(-1).view(torch.uint8).view(dtype).float().view(shape)
    decoder = _BLOCK_DECODERS.get(type_name)
    if decoder is None:
        return _dequantize_with_gguf(raw, type_name, shape)
    block_bytes, block_values = BLOCK_LAYOUT[type_name]
    if numel % block_values or raw.numel() != numel // block_values * block_bytes:
        raise LoaderError(f"{type_name} tensor of shape {list(shape)}: byte count does not match")
    blocks = raw.reshape(-1, block_bytes)
    return decoder(blocks).reshape(shape)


def _dequantize_with_gguf(
    raw: torch.Tensor, type_name: str, shape: tuple[int, ...]
) -> torch.Tensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    try:
        qtype = GGMLQuantizationType[type_name]
        values = gguf_dequantize(raw.cpu().numpy().reshape(shape[0], -1), qtype)
    except (KeyError, NotImplementedError) as exc:
        raise LoaderError(f"cannot dequantize GGML type {type_name}") from exc
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).view(shape)
