"""A weight kept quantized: integer codes plus a float32 scale and offset per group of inputs.

`w[n, k] = scales[n, k // group] * codes[n, k] + offsets[n, k // group]`. Every format the
engine keeps packed maps onto this one form without rounding anything: GGUF's Q4_0/Q4_1 (and
the K-quants, whose 6-bit sub-scales times the fp16 super-scale are exact in float32), AWQ
and GPTQ (offset = -zero * scale). Codes are 4-bit, two to a byte (in each run of 32 values,
byte j holds value j in its low nibble and value j + 16 in its high one: GGUF's Q4_0 order),
or 8-bit. Signed codes are stored shifted to unsigned, the shift folded into the offset.
The kernels (`engine.kernels.cpu`, `engine.kernels.triton_quant_matmul`) read this form; the
reference is `dequantize()` followed by `F.linear`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

NIBBLE_RUN = 32  # values per run of the 4-bit packing


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[N, K] codes in 0..15 -> [N, K/2] bytes in the 4-bit order above (K a multiple of 32)."""
    rows, cols = codes.shape
    runs = codes.to(torch.uint8).reshape(rows, cols // NIBBLE_RUN, 2, NIBBLE_RUN // 2)
    return (runs[:, :, 0] | (runs[:, :, 1] << 4)).reshape(rows, cols // 2)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_nibbles`: [N, K/2] bytes -> [N, K] codes."""
    rows, half = packed.shape
    runs = packed.reshape(rows, half // (NIBBLE_RUN // 2), NIBBLE_RUN // 2)
    return torch.stack([runs & 0x0F, runs >> 4], dim=2).reshape(rows, half * 2)


@dataclass
class QuantizedWeight:
    """One weight `[out_features, in_features]` in the form described above."""

    codes: torch.Tensor  # uint8 [N, K/2] (bits 4) or [N, K] (bits 8)
    scales: torch.Tensor  # float32 [N, K/group]
    offsets: torch.Tensor  # float32 [N, K/group]
    bits: int
    group_size: int
    source_format: str  # what it came from (Q4_1, AWQ, ...), for logs and memory reports

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"codes of {self.bits} bits are not supported (4 or 8)")
        granule = NIBBLE_RUN if self.bits == 4 else 16
        if self.group_size % granule:
            raise ValueError(f"group size {self.group_size} is not a multiple of {granule}")
        rows, groups = self.scales.shape
        in_features = groups * self.group_size
        if self.offsets.shape != self.scales.shape:
            raise ValueError("scales and offsets differ in shape")
        per_row = in_features // 2 if self.bits == 4 else in_features
        if tuple(self.codes.shape) != (rows, per_row):
            raise ValueError(
                f"codes of shape {tuple(self.codes.shape)} do not fit {rows}x{in_features} "
                f"at {self.bits} bits"
            )

    @property
    def shape(self) -> tuple[int, int]:
        return self.scales.shape[0], self.scales.shape[1] * self.group_size

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.offsets))

    def rows(self, start: int, length: int) -> QuantizedWeight:
        """Output rows [start, start + length)."""
        return QuantizedWeight(
            self.codes.narrow(0, start, length),
            self.scales.narrow(0, start, length),
            self.offsets.narrow(0, start, length),
            self.bits,
            self.group_size,
            self.source_format,
        )

    def integer_codes(self) -> torch.Tensor:
        """[N, K] codes, one per byte."""
        return unpack_nibbles(self.codes) if self.bits == 4 else self.codes

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The float32 weight (or only `rows` of it): the reference every kernel must match."""
        codes, scales, offsets = self.codes, self.scales, self.offsets
        if rows is not None:
            codes, scales, offsets = codes[rows], scales[rows], offsets[rows]
        values = (unpack_nibbles(codes) if self.bits == 4 else codes).float()
        grouped = values.view(values.shape[0], -1, self.group_size)
        return (grouped * scales.unsqueeze(-1) + offsets.unsqueeze(-1)).view(values.shape)

    def with_layout(self, bits: int, group_size: int) -> QuantizedWeight:
        """The same values with wider codes and/or smaller groups (to fuse unlike parts)."""
        if bits < self.bits or self.group_size % group_size:
            raise ValueError(f"cannot hold {self.describe()} as {bits}-bit, group {group_size}")
        codes = self.integer_codes()
        repeat = self.group_size // group_size
        return QuantizedWeight(
            pack_nibbles(codes) if bits == 4 else codes.contiguous(),
            self.scales.repeat_interleave(repeat, dim=1).contiguous(),
            self.offsets.repeat_interleave(repeat, dim=1).contiguous(),
            bits,
            group_size,
            self.source_format,
        )

    def describe(self) -> str:
        return f"{self.source_format} ({self.bits}-bit codes, groups of {self.group_size})"

    def to(self, device: torch.device) -> QuantizedWeight:
        return QuantizedWeight(
            self.codes.to(device),
            self.scales.to(device),
            self.offsets.to(device),
            self.bits,
            self.group_size,
            self.source_format,
        )


def concat_rows(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """Row blocks stacked (q, k, v or gate, up), brought to one layout where they differ."""
    bits = max(p.bits for p in parts)
    group = math.gcd(*(p.group_size for p in parts))
    if bits == 4 and group % NIBBLE_RUN:
        bits = 8
    if group % 16:
        raise ValueError("the parts' groups have no common size")
    same = [
        p if (p.bits, p.group_size) == (bits, group) else p.with_layout(bits, group) for p in parts
    ]
    formats = sorted({p.source_format for p in parts})
    return QuantizedWeight(
        torch.cat([p.codes for p in same]),
        torch.cat([p.scales for p in same]),
        torch.cat([p.offsets for p in same]),
        bits,
        group,
        "+".join(formats),
    )
