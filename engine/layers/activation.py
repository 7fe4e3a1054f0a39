"""SwiGLU on a fused gate/up projection, via the kernel dispatch."""

from __future__ import annotations

import torch
from torch import nn

from engine import kernels


class SiluAndMul(nn.Module):
    """`silu(gate) * up` where the input is `[..., 2 * d]` = gate then up."""

    def __init__(self, backend: kernels.Backend = "torch") -> None:
        super().__init__()
        self.backend = backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.silu_and_mul(x.contiguous(), backend=self.backend)
