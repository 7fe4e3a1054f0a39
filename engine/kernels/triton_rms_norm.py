"""Triton RMSNorm fused with the residual add (contract: ``reference.rms_norm_ref``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.launch_args import as_rows


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    stride_x,
    stride_residual,
    stride_out,
    stride_residual_out,
    hidden_size,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One program per row; the whole row fits one tile for every supported hidden size.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden_size
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
        # Round the sum to the model dtype first, exactly as the unfused `x + residual`.
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * stride_residual_out + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    inv_rms = tl.math.rsqrt(tl.sum(x32 * x32, axis=0) / hidden_size + eps)
    normed = (x32 * inv_rms).to(x_ptr.dtype.element_ty)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    result = weight.to(tl.float32) * normed.to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, result.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``weight * norm(x)``; with ``residual``, ``(norm(x + residual), x + residual)``."""
    hidden_size = x.shape[-1]
    if weight.shape != (hidden_size,):
        raise ValueError(f"weight must be [{hidden_size}], got {tuple(weight.shape)}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual {tuple(residual.shape)} does not match x {tuple(x.shape)}")
    rows = as_rows(x, hidden_size)
    out_dtype = torch.promote_types(weight.dtype, x.dtype)
    out = torch.empty(rows.shape, dtype=out_dtype, device=x.device)
    if residual is not None:
        residual_rows = as_rows(residual, hidden_size)
        residual_out = torch.empty_like(rows)
    else:
        residual_rows = residual_out = rows  # unused when HAS_RESIDUAL is off
    if rows.shape[0] > 0:
        _rms_norm_kernel[(rows.shape[0],)](
            rows,
            residual_rows,
            weight,
            out,
            residual_out,
            rows.stride(0),
            residual_rows.stride(0),
            out.stride(0),
            residual_out.stride(0),
            hidden_size,
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=triton.next_power_of_2(hidden_size),
        )
    if residual is None:
        return out.view(x.shape)
    return out.view(x.shape), residual_out.view(x.shape)
