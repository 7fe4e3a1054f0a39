"""Linear layers on the CPU through oneDNN with weights packed once at load.

MKL's sgemm, which `F.linear` calls on the CPU, is slow for the short, wide products of
decode steps (a handful of rows against a large weight). oneDNN with the weight reordered
once into its blocked layout runs them two to three times faster on this project's
machines (SmolLM2's 30 layers at 16 rows: 46 ms -> 15 ms, see docs/benchmarks.md); results
differ from `F.linear` only in float rounding (about 1e-6 relative).

`pack(weight)` returns the packed tensor, or None where this torch has no oneDNN linear,
the dtype is not float32, or a probe product disagrees with `F.linear`; callers then keep
using `F.linear`. `pack_model` packs every linear of a loaded model (the runner calls it on
the CPU) and frees each dense weight no other module shares, so memory does not double;
a tied embedding keeps its dense rows for the lookup.
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

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


def pack_model(model: nn.Module) -> int:
    """Pack the weight of every module with `pack_for_cpu`; returns the packed bytes."""
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    total = 0
    for module in model.modules():
        pack_for_cpu = getattr(module, "pack_for_cpu", None)
        if pack_for_cpu is None or not pack_for_cpu():
            continue
        packed = module.packed
        total += packed.numel() * packed.element_size()
        weight = module.weight
        if uses[id(weight)] == 1:  # only the packed copy is read from now on
            weight.data = torch.empty(0, dtype=weight.dtype, device=weight.device)
    return total
