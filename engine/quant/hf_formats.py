"""AWQ and GPTQ checkpoints (HF `quantization_config`): their int32-packed tensors as a
`QuantizedWeight` per linear layer.

Both are weight-only integer quantization with a float16 scale and an integer zero per group
of `group_size` inputs: `w = scale * (q - zero)`, kept here as code q, scale and offset
`-scale * zero` (exact in float32). AWQ (GEMM layout) packs eight 4-bit values per int32
along the outputs in the order 0, 2, 4, 6, 1, 3, 5, 7; GPTQ packs `32 / bits` values along
the inputs, its zeros along the outputs, and (format v1, the default) stores each zero minus
one. What the kernels cannot run is refused by `check_config` with the reason: other bit
widths, GPTQ's act-order (`desc_act`: a per-input group index), AWQ's GEMV/Marlin layouts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from engine.errors import LoaderError
from engine.layers.linear import QuantizedSource, WeightSource
from engine.quant.weight import QuantizedWeight, pack_nibbles

AWQ_NIBBLE_OF_COLUMN = (0, 4, 1, 5, 2, 6, 3, 7)  # column c of a word is in nibble [c]
PACKED_PARTS = ("qweight", "qzeros", "scales")


def check_config(config: dict[str, Any]) -> tuple[str, int, int | None]:
    """(method, bits, group size or None for one group per row) of a servable config, else a
    `LoaderError` saying why the checkpoint cannot be served."""
    method = str(config.get("quant_method", "")).lower()
    bits = int(config.get("bits", config.get("w_bit", 0)) or 0)
    group = int(config.get("group_size", config.get("q_group_size", -1)) or -1)
    if method == "awq":
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm":
            raise LoaderError(f"AWQ version {version!r} is not supported (only the GEMM layout)")
        if bits != 4:
            raise LoaderError(f"AWQ with {bits}-bit weights is not supported (only 4-bit)")
        if config.get("zero_point") is False:
            raise LoaderError("AWQ without zero points is not supported")
    elif method == "gptq":
        if bits not in (4, 8):
            raise LoaderError(f"GPTQ with {bits}-bit weights is not supported (4 or 8)")
        if config.get("desc_act"):
            raise LoaderError(
                "GPTQ with desc_act (act-order: each input has its own group index) is not "
                "supported; the kernels need inputs grouped in order"
            )
        fmt = str(config.get("checkpoint_format", "gptq")).lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise LoaderError(f"GPTQ checkpoint_format {fmt!r} is not supported")
    else:
        raise LoaderError(
            f"quantization method {method or 'unknown'!r} is not supported; the engine serves "
            "AWQ (4-bit, GEMM layout) and GPTQ (4/8-bit, no act-order) checkpoints and GGUF files"
        )
    return method, bits, None if group <= 0 else group


def _unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 words -> their `32 / bits` fields in order, spread along `dim`."""
    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    words = packed.to(torch.int32).unsqueeze(-1)
    fields = (words >> shifts) & ((1 << bits) - 1)  # [..., per_word]
    if dim == 0:  # fields of word (r, c) are rows r*per_word .. of column c
        return fields.permute(0, 2, 1).reshape(packed.shape[0] * per_word, packed.shape[1])
    return fields.reshape(packed.shape[0], packed.shape[1] * per_word)


def _awq_columns(packed: torch.Tensor) -> torch.Tensor:
    """AWQ's [rows, cols/8] words -> [rows, cols] values in column order."""
    fields = _unpack_int32(packed, 4, 1).view(packed.shape[0], packed.shape[1], 8)
    order = torch.tensor(AWQ_NIBBLE_OF_COLUMN)
    return fields[:, :, order].reshape(packed.shape[0], packed.shape[1] * 8)


def to_quantized(
    method: str, bits: int, group: int | None, parts: dict[str, torch.Tensor], v2: bool
) -> QuantizedWeight:
    """One layer's packed tensors -> `QuantizedWeight` ([out, in] rows)."""
    scales = parts["scales"].float()  # [in/group, out]
    if method == "awq":
        codes = _awq_columns(parts["qweight"])  # [in, out]
        zeros = _awq_columns(parts["qzeros"])  # [in/group, out]
    else:
        codes = _unpack_int32(parts["qweight"], bits, 0)
        zeros = _unpack_int32(parts["qzeros"], bits, 1) + (0 if v2 else 1)
    in_features, out_features = codes.shape
    group = group or in_features
    if in_features % group or scales.shape != (in_features // group, out_features):
        raise LoaderError(
            f"{method.upper()} scales of shape {tuple(scales.shape)} do not fit a "
            f"{in_features}x{out_features} weight in groups of {group}"
        )
    zeros = zeros[:, :out_features].float()
    codes_t = codes.t().to(torch.uint8)
    if bits == 4 and group % 32 == 0:
        stored, kept_bits = pack_nibbles(codes_t), 4
    else:
        stored, kept_bits = codes_t.contiguous(), 8
    return QuantizedWeight(
        stored.contiguous(),
        scales.t().contiguous(),
        (-(scales * zeros)).t().contiguous(),
        kept_bits,
        group,
        method.upper(),
    )


def _trivial_group_index(g_idx: torch.Tensor, group: int | None) -> bool:
    expected = torch.arange(g_idx.numel()) // (group or g_idx.numel())
    return bool(torch.equal(g_idx.to(torch.int64), expected))


def assemble(
    tensors: Iterator[tuple[str, WeightSource]], config: dict[str, Any]
) -> Iterator[tuple[str, WeightSource]]:
    """The checkpoint's tensors with each layer's packed parts replaced by one
    `<layer>.weight` as a `QuantizedSource` (floats pass through)."""
    method, bits, group = check_config(config)
    v2 = str(config.get("checkpoint_format", "gptq")).lower() == "gptq_v2"
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, source in tensors:
        layer, _, part = name.rpartition(".")
        if part == "g_idx":
            if not _trivial_group_index(source.full(), group):
                raise LoaderError(f"{name}: inputs out of group order (act-order) not supported")
            continue
        if part not in PACKED_PARTS:
            yield name, source
            continue
        parts = pending.setdefault(layer, {})
        parts[part] = source.full()
        if len(parts) == len(PACKED_PARTS):
            del pending[layer]
            try:
                weight = to_quantized(method, bits, group, parts, v2)
            except LoaderError as exc:
                raise LoaderError(f"{layer}: {exc}") from exc
            yield f"{layer}.weight", QuantizedSource(weight)
    if pending:
        layer, parts = next(iter(pending.items()))
        raise LoaderError(f"{layer} lacks {', '.join(p for p in PACKED_PARTS if p not in parts)}")
