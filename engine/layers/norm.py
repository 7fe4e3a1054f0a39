"""RMSNorm (fp32 statistics, like HF), optionally fused with the residual add.

Dispatches to `engine.kernels.rms_norm` (the torch reference or the Triton kernel).
"""

from __future__ import annotations

import torch
from torch import nn

from engine import kernels


class RMSNorm(nn.Module):
    def __init__(
        self, hidden_size: int, eps: float = 1e-6, backend: kernels.Backend = "torch"
    ) -> None:
        super().__init__()
        self.eps = eps
        self.backend = backend
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """With `residual`, returns (norm(x + residual), x + residual) for the next block."""
        if x.dim() == 2:  # the hidden states `[tokens, hidden]`: no reshaping calls
            return kernels.rms_norm(x, self.weight, self.eps, residual, backend=self.backend)
        shape = x.shape
        flat = x.reshape(-1, shape[-1]).contiguous()
        if residual is None:
            out = kernels.rms_norm(flat, self.weight, self.eps, backend=self.backend)
            return out.reshape(shape)  # type: ignore[union-attr]
        flat_residual = residual.reshape(-1, shape[-1]).contiguous()
        out, summed = kernels.rms_norm(
            flat, self.weight, self.eps, flat_residual, backend=self.backend
        )
        return out.reshape(shape), summed.reshape(shape)
