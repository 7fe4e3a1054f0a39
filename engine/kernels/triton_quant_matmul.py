"""Triton `x @ w.T` with `w` a `QuantizedWeight`, dequantized tile by tile inside the matmul.

Contract: `quant_linear_ref` (the float32 weight from `QuantizedWeight.dequantize()`, then
`F.linear` in float32, the result in `x`'s dtype). Each program computes a BLOCK_M x BLOCK_N
tile of the output; per BLOCK_K inputs it loads the codes (4-bit: byte `run * 16 + j % 16`,
nibble `j // 16` of value j of each run of 32; 8-bit: one byte), the group's scale and
offset, forms the float32 weights in registers and accumulates `tl.dot` in float32 (IEEE
precision, no TF32). The weight never exists as floats in memory. Written for CUDA; tested
under `TRITON_INTERPRET=1` on the CPU and, in a GPU session, by scripts/gpu_check.sh. The
engine keeps weights quantized only on the CPU for now (`EngineConfig.keeps_quantized`):
serving with this kernel waits for that GPU check.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from engine.quant.weight import QuantizedWeight


def quant_linear_ref(x: torch.Tensor, weight: QuantizedWeight) -> torch.Tensor:
    dense = weight.dequantize().to(x.device)
    return F.linear(x.float(), dense).to(x.dtype)


@triton.jit
def _quant_linear_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    offsets_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_codes,
    stride_groups,
    stride_om,
    GROUP: tl.constexpr,
    BITS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + rows[:, None].to(tl.int64) * stride_xm + ks[None, :],
            mask=row_ok[:, None],
            other=0.0,
        ).to(tl.float32)
        if BITS == 4:
            byte_index = (ks // 32) * 16 + (ks % 16)
            shift = ((ks % 32) // 16) * 4
            raw = tl.load(
                codes_ptr + cols[:, None].to(tl.int64) * stride_codes + byte_index[None, :],
                mask=col_ok[:, None],
                other=0,
            ).to(tl.int32)
            codes = (raw >> shift[None, :]) & 0xF
        else:
            codes = tl.load(
                codes_ptr + cols[:, None].to(tl.int64) * stride_codes + ks[None, :],
                mask=col_ok[:, None],
                other=0,
            ).to(tl.int32)
        groups = ks // GROUP
        where = cols[:, None].to(tl.int64) * stride_groups + groups[None, :]
        scale = tl.load(scales_ptr + where, mask=col_ok[:, None], other=0.0)
        offset = tl.load(offsets_ptr + where, mask=col_ok[:, None], other=0.0)
        w = codes.to(tl.float32) * scale + offset  # [BLOCK_N, BLOCK_K]
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    out = out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def quant_linear_triton(x: torch.Tensor, weight: QuantizedWeight) -> torch.Tensor:
    """`x[..., K]` (float32, float16 or bfloat16) times the quantized `weight` `[N, K]`."""
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} inputs, the weight {k}")
    flat = x.reshape(-1, k).contiguous()
    out = torch.empty(flat.shape[0], n, dtype=x.dtype, device=x.device)
    block_k = 32 if weight.group_size % 32 == 0 else 16  # K holds whole tiles: whole groups
    block_m = 16 if flat.shape[0] <= 16 else 32
    block_n = 64
    grid = (triton.cdiv(flat.shape[0], block_m), triton.cdiv(n, block_n))
    if flat.shape[0]:
        _quant_linear_kernel[grid](
            flat, weight.codes, weight.scales, weight.offsets, out,
            flat.shape[0], n, k,
            flat.stride(0), weight.codes.stride(0), weight.scales.stride(0), out.stride(0),
            GROUP=weight.group_size, BITS=weight.bits,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        )  # fmt: skip
    return out.view(*x.shape[:-1], n)
