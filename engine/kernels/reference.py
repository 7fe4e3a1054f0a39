"""Pure-PyTorch reference of every kernel: the CPU path, and the oracle for the Triton tests.

KV cache layout (one pair per layer): ``[num_blocks, block_size, num_kv_heads, head_dim]``.
A token's slot is ``block_id * block_size + offset``; slot ``-1`` marks padding.
"""

from __future__ import annotations

import torch


def store_kv_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]`` into their slots."""
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    flat_k = k_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    flat_v = v_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    flat_k[slots] = key[valid].to(k_cache.dtype)
    flat_v[slots] = value[valid].to(v_cache.dtype)


def paged_attention_ref(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of a ragged batch of new tokens over their paged KV history.

    ``query`` is ``[num_tokens, num_heads, head_dim]``, the new tokens of every sequence laid
    end to end; sequence ``b`` owns rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``.
    ``context_lens[b]`` counts every KV entry of ``b`` *including* the new tokens, which must
    already be stored. New token ``i`` of a sequence with ``q_len`` new tokens sits at position
    ``context_len - q_len + i`` and sees positions ``0..that`` (so decode, prefill and chunked
    prefill over a cached prefix are one case). A row with ``context_len == 0`` is padding
    and yields zeros. Softmax runs in fp32.
    """
    _, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    out = torch.zeros_like(query)
    starts = cu_seqlens_q.tolist()
    lens = context_lens.tolist()
    for b, context_len in enumerate(lens):
        q_start, q_end = starts[b], starts[b + 1]
        q_len = q_end - q_start
        if q_len == 0 or context_len == 0:
            continue
        num_ctx_blocks = (context_len + block_size - 1) // block_size
        blocks = block_tables[b, :num_ctx_blocks].long()
        keys = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:context_len]
        values = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:context_len]
        keys = keys.float().repeat_interleave(group, dim=1)  # [ctx, H, D]
        values = values.float().repeat_interleave(group, dim=1)
        q = query[q_start:q_end].float()  # [q_len, H, D]
        scores = torch.einsum("qhd,khd->hqk", q, keys) * scale
        q_pos = torch.arange(context_len - q_len, context_len, device=query.device)
        k_pos = torch.arange(context_len, device=query.device)
        mask = k_pos[None, :] > q_pos[:, None]
        scores.masked_fill_(mask[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q_start:q_end] = torch.einsum("hqk,khd->qhd", probs, values).to(query.dtype)
    return out


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """HF RMSNorm: fp32 statistics, rounded to ``x``'s dtype, then scaled by ``weight``.

    With ``residual`` the input is ``x + residual`` (in ``x``'s dtype) and the sum is returned
    as well, for the next block's residual.
    """
    if residual is not None:
        x = x + residual
    x32 = x.float()
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    out = weight * normed
    return out if residual is None else (out, x)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU on a fused gate/up projection ``[..., 2 * d]`` (gate first)."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def rope_ref(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding in the NeoX/HF ``rotate_half`` layout, computed in fp32.

    ``query``/``key`` are ``[num_tokens, heads, head_dim]``; ``cos_cache``/``sin_cache`` are
    ``[max_position, head_dim / 2]``, indexed by ``positions`` ``[num_tokens]``.
    """
    cos = cos_cache[positions].float().unsqueeze(1)
    sin = sin_cache[positions].float().unsqueeze(1)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        first, second = x.float().chunk(2, dim=-1)
        return torch.cat((first * cos - second * sin, second * cos + first * sin), -1).to(x.dtype)

    return rotate(query), rotate(key)
