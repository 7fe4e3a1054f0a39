"""Linear layers on the CPU through oneDNN with weights packed into its blocked layout.

One of the candidates `engine.layers.kernel_choice` times at load: on an AMD EPYC it ran
SmolLM2's decode products two to three times faster than MKL's sgemm (`F.linear`), on an
Intel Xeon of the same machine kind about two times slower, so it is measured, not assumed.
Results differ from `F.linear` only in float rounding (about 1e-6 relative).

`pack(weight)` returns the packed tensor, or None where this torch has no oneDNN linear,
the dtype is not float32, or a probe product disagrees with `F.linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PROBE_ROWS = 3
PROBE_TOLERANCE = 1e-4  # relative to the largest output


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or weight.dim() != 2:
        return None
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 16)
        probe = torch.randn(PROBE_ROWS, weight.shape[1], generator=torch.Generator().manual_seed(0))
        expected = F.linear(probe, weight)
        got = packed_linear(probe, packed, None)
    except (RuntimeError, AttributeError, NotImplementedError):
        return None
    scale = float(expected.abs().max()) or 1.0
    if got.shape != expected.shape or float((got - expected).abs().max()) > PROBE_TOLERANCE * scale:
        return None
    return packed


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` with the weight `pack` made."""
    flat = x.reshape(-1, x.shape[-1])
    out = torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], out.shape[-1])
