"""Rotary position embeddings (NeoX/HF `rotate_half` layout), with llama3 and linear scaling."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
Angles = tuple[torch.Tensor, torch.Tensor]  # cos, sin: [num_tokens, 1, head_dim / 2]


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Long wavelengths are slowed by `factor`, short ones kept, the band between blended."""
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling.get("low_freq_factor", 1.0))
    high_freq_factor = float(scaling.get("high_freq_factor", 4.0))
    old_context_len = float(scaling.get("original_max_position_embeddings", 8192))
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(
        self,
        head_dim: int,
        max_position: int,
        base: float,
        scaling: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        rope_type = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"unsupported rope scaling {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        if rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, scaling or {})
        elif rope_type == "linear":
            inv_freq = inv_freq / float((scaling or {})["factor"])
        positions = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        # [max_position, head_dim]: cos then sin halves of the cat(freqs, freqs) layout
        self.register_buffer("cos_cache", freqs.cos(), persistent=False)
        self.register_buffer("sin_cache", freqs.sin(), persistent=False)

    def angles(self, positions: torch.Tensor) -> Angles:
        """cos and sin `[num_tokens, 1, head_dim / 2]` of a step's positions: gathered once
        per step and shared by every layer."""
        return self.cos_cache[positions].unsqueeze(1), self.sin_cache[positions].unsqueeze(1)

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`query`/`key` are `[num_tokens, heads, head_dim]`."""
        return rotate(self.angles(positions), query, key)


def rotate(
    angles: Angles, query: torch.Tensor, key: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate `query`/`key` `[num_tokens, heads, head_dim]` by `RotaryEmbedding.angles`."""
    cos, sin = angles
    return _rotate(query, cos, sin), _rotate(key, cos, sin)


def rotate_heads(angles: Angles, heads: torch.Tensor) -> torch.Tensor:
    """Rotate `[num_tokens, heads, head_dim]` (query and key heads side by side: one set of
    calls for both, the same arithmetic) by `RotaryEmbedding.angles`."""
    cos, sin = angles
    return _rotate(heads, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = (x if x.dtype == torch.float32 else x.float()).chunk(2, dim=-1)
    out = torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)
    return out if out.dtype == x.dtype else out.to(x.dtype)
