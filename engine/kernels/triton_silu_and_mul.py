"""Triton SwiGLU activation ``silu(gate) * up`` (contract: ``reference.silu_and_mul_ref``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.launch_args import as_rows


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    stride_x,
    stride_out,
    width,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + width + cols, mask=mask, other=0.0)
    # Round silu(gate) to the model dtype before the product, as the unfused torch code does.
    activated = (gate * tl.sigmoid(gate)).to(x_ptr.dtype.element_ty)
    result = activated.to(tl.float32) * up.to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, result.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """``x`` is ``[..., 2 * d]`` (gate then up); returns ``[..., d]``."""
    if x.shape[-1] % 2:
        raise ValueError(f"the last dimension must be even (gate and up), got {x.shape[-1]}")
    width = x.shape[-1] // 2
    rows = as_rows(x, x.shape[-1])
    out = torch.empty((rows.shape[0], width), dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(width))
    if rows.shape[0] > 0:
        grid = (rows.shape[0], triton.cdiv(width, block))
        _silu_and_mul_kernel[grid](rows, out, rows.stride(0), out.stride(0), width, BLOCK=block)
    return out.view(*x.shape[:-1], width)
