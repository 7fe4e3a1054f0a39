"""Pure-PyTorch reference of every kernel: the CPU path, and the oracle for the Triton tests.

KV cache layout (one pair per layer): ``[num_blocks, block_size, num_kv_heads, head_dim]``.
A token's slot is ``block_id * block_size + offset``; slot ``-1`` marks padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def store_kv_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    all_slots_valid: bool = False,
) -> None:
    """Write ``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]`` into their slots;
    ``all_slots_valid``: the caller knows no slot is padding, so none is looked for."""
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    flat_k = k_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    flat_v = v_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    slots = slot_mapping if slot_mapping.dtype == torch.int64 else slot_mapping.long()
    if not all_slots_valid and not bool((slots >= 0).all()):  # padding rows: keep the others
        valid = slots >= 0
        slots, key, value = slots[valid], key[valid], value[valid]
    if key.dtype != k_cache.dtype:
        key, value = key.to(k_cache.dtype), value.to(v_cache.dtype)
    flat_k.index_copy_(0, slots, key)
    flat_v.index_copy_(0, slots, value)


# Elements of one batched attention's largest temporary (scores, or gathered keys): 32 MiB
# of fp32. A batch over the budget is split into groups of sequences, and a long prefill
# into chunks of query rows, so memory stays bounded however long the context.
ATTENTION_BUDGET = 1 << 23

Piece = tuple[int, int, int, int]  # first query row, query rows, keys of its last row, sequence


@dataclass
class AttentionGroup:
    """Pieces of sequences attended together, padded to `max_rows` x `max_keys`."""

    size: int
    max_rows: int
    max_keys: int
    in_order: bool  # one row per piece, the pieces being query rows 0 .. size - 1
    first: torch.Tensor  # [size] int64: each piece's first query row
    slots: torch.Tensor  # [size * max_keys] int64: the cache slot of every key position
    mask: torch.Tensor  # bool, True = attend: [size, 1, 1, max_keys] for single rows, else
    # [size, 1, group * max_rows, max_keys] (a query head's group of heads as extra rows)
    tokens: torch.Tensor | None  # [size, max_rows] int64 query rows (padding 0), multi-row
    real: torch.Tensor | None  # [size, max_rows] bool: not padding, multi-row


@dataclass
class PagedAttentionPlan:
    """What the torch path derives from a step's layout alone (query and context lengths,
    block tables): made once per step and shared by every layer."""

    num_heads: int
    num_kv_heads: int
    groups: list[AttentionGroup]


@dataclass
class AttentionMetadata:
    """One step's batch layout, made once by the runner and read by every attention layer;
    each backend takes what it needs of it (Triton: the grid and splits, torch: the plan)."""

    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 = padding
    cu_seqlens_q: torch.Tensor  # [B + 1] int32
    context_lens: torch.Tensor  # [B] int32, KV entries including the new tokens
    block_tables: torch.Tensor  # [B, max_blocks] int32
    max_query_len: int | None = None  # the longest run of new tokens; None: read on the host
    num_kv_splits: int | None = None  # flash-decoding splits (Triton); None: the kernel picks
    torch_plan: PagedAttentionPlan | None = None  # the torch path's layout, once per step
    all_slots_valid: bool = False  # no slot is -1 (padding): the torch path checks none


def plan_paged_attention(
    cu_seqlens_q: Sequence[int],
    context_lens: Sequence[int],
    block_tables: torch.Tensor,
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    budget: int = ATTENTION_BUDGET,
) -> PagedAttentionPlan:
    """The groups of `paged_attention_ref` for this layout (host lengths, device tables)."""
    pieces: list[Piece] = []
    for b, context_len in enumerate(context_lens):
        q_start, q_end = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        if q_end == q_start or context_len == 0:
            continue
        rows_per_piece = max(1, budget // (num_heads * int(context_len)))
        for first in range(q_start, q_end, rows_per_piece):
            rows = min(rows_per_piece, q_end - first)
            pieces.append((first, rows, int(context_len) - (q_end - first - rows), b))
    if not pieces:
        return PagedAttentionPlan(num_heads, num_kv_heads, [])
    groups = _split(pieces, num_heads, num_kv_heads * head_dim, budget)
    group = num_heads // num_kv_heads
    made = [_group(g, block_tables, block_size, group) for g in groups]
    return PagedAttentionPlan(num_heads, num_kv_heads, made)


def _split(pieces: list[Piece], num_heads: int, kv_width: int, budget: int) -> list[list[Piece]]:
    """Each group's larger temporary (padded scores or gathered keys) within `budget`
    elements; one group when everything fits (the usual step)."""

    def size(count: int, rows: int, keys: int) -> int:
        return count * keys * max(rows * num_heads, kv_width)

    if size(len(pieces), max(p[1] for p in pieces), max(p[2] for p in pieces)) <= budget:
        return [pieces]
    groups: list[list[Piece]] = []
    group: list[Piece] = []
    rows = keys = 0
    for piece in sorted(pieces, key=lambda p: (p[1], p[2])):  # similar shapes pad little
        grown_rows, grown_keys = max(rows, piece[1]), max(keys, piece[2])
        if group and size(len(group) + 1, grown_rows, grown_keys) > budget:
            groups.append(group)
            group, grown_rows, grown_keys = [], piece[1], piece[2]
        group.append(piece)
        rows, keys = grown_rows, grown_keys
    groups.append(group)
    return groups


def _group(
    pieces: list[Piece], block_tables: torch.Tensor, block_size: int, group: int
) -> AttentionGroup:
    device = block_tables.device
    n = len(pieces)
    max_rows = max(piece[1] for piece in pieces)
    max_keys = max(piece[2] for piece in pieces)
    first, rows, keys, seqs = torch.tensor(pieces, dtype=torch.int64).T.to(device)
    # past a piece's keys, its own first slot again (masked): nothing of another sequence
    # and no unwritten slot is ever read, so garbage cannot turn into NaN
    key_pos = torch.arange(max_keys, device=device)
    blocks = block_tables.index_select(0, seqs)[:, key_pos // block_size].long()
    slots = blocks * block_size + key_pos % block_size
    slots = torch.where(key_pos[None, :] < keys[:, None], slots, slots[:, :1]).reshape(-1)
    if max_rows == 1:  # decodes (and one-token chunks): no padding rows
        mask = (key_pos[None, :] < keys[:, None])[:, None, None, :]
        in_order = all(piece[0] == i for i, piece in enumerate(pieces))
        return AttentionGroup(n, 1, max_keys, in_order, first, slots, mask, None, None)
    row = torch.arange(max_rows, device=device)
    real = row[None, :] < rows[:, None]
    tokens = torch.where(real, first[:, None] + row[None, :], 0)
    position = (keys - rows)[:, None] + row[None, :]  # padding rows: past the keys, unused
    mask = key_pos[None, None, :] <= position[:, :, None]  # [n, max_rows, max_keys]
    mask = mask[:, None, None].expand(n, 1, group, max_rows, max_keys)
    mask = mask.reshape(n, 1, group * max_rows, max_keys)
    return AttentionGroup(n, max_rows, max_keys, False, first, slots, mask, tokens, real)


def paged_attention_ref(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    *,
    budget: int = ATTENTION_BUDGET,
) -> torch.Tensor:
    """Causal attention of a ragged batch of new tokens over their paged KV history.

    ``query`` is ``[num_tokens, num_heads, head_dim]``, the new tokens of every sequence laid
    end to end; in ``meta``, sequence ``b`` owns rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``
    and ``context_lens[b]`` counts every KV entry of ``b`` *including* the new tokens, which
    must already be stored. New token ``i`` of a sequence with ``q_len`` new tokens sits at
    position ``context_len - q_len + i`` and sees positions ``0..that`` (so decode, prefill and
    chunked prefill over a cached prefix are one case). A row with ``context_len == 0`` is
    padding and yields zeros, as do query rows past ``cu_seqlens_q[-1]``. Softmax runs in fp32.

    Sequences are batched (the CPU path's speed): their keys and values are gathered into
    padded ``[n, kv_heads, keys, head_dim]`` tensors and one masked scaled-dot-product
    attention per group runs every head (fp32 inputs, so fp32 softmax). ``budget`` bounds a
    group's temporaries in elements: groups of sequences, and long prefills in row chunks.
    ``meta.torch_plan`` (from `plan_paged_attention` over the same layout) skips deriving the
    groups.
    """
    _, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    plan = meta.torch_plan
    if plan is None:
        plan = plan_paged_attention(
            meta.cu_seqlens_q.tolist(),
            meta.context_lens.tolist(),
            meta.block_tables,
            block_size,
            num_heads,
            num_kv_heads,
            head_dim,
            budget,
        )
    assert (plan.num_heads, plan.num_kv_heads) == (num_heads, num_kv_heads), "plan of other heads"
    out: torch.Tensor | None
    if len(plan.groups) == 1 and plan.groups[0].in_order and len(query) == plan.groups[0].size:
        out = None  # a decode-only step: the attention's rows are the output's, in order
    else:
        out = torch.zeros_like(query)
    flat_k = k_cache.reshape(-1, num_kv_heads, head_dim)
    flat_v = v_cache.reshape(-1, num_kv_heads, head_dim)
    group = num_heads // num_kv_heads
    for g in plan.groups:
        n, rows, keys = g.size, g.max_rows, g.max_keys
        # [n, kv_heads, keys, head_dim], strided: SDPA reads it as it is
        k = flat_k.index_select(0, g.slots).view(n, keys, num_kv_heads, head_dim)
        v = flat_v.index_select(0, g.slots).view(n, keys, num_kv_heads, head_dim)
        k, v = _fp32(k.transpose(1, 2)), _fp32(v.transpose(1, 2))
        # query head h uses kv head h // group: a kv head's query heads are its query rows
        if rows == 1:
            q = query[:n] if g.in_order else query.index_select(0, g.first)
            q = _fp32(q).reshape(n, num_kv_heads, group, head_dim)
        else:
            assert g.tokens is not None and g.real is not None
            q = _fp32(query[g.tokens]).view(n, rows, num_kv_heads, group, head_dim)
            q = q.permute(0, 2, 3, 1, 4).reshape(n, num_kv_heads, group * rows, head_dim)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=g.mask, scale=scale)
        if out is None:
            attended = attended.reshape(n, num_heads, head_dim)
            return attended if attended.dtype == query.dtype else attended.to(query.dtype)
        if rows == 1:
            out.index_copy_(0, g.first, attended.reshape(n, num_heads, head_dim).to(out.dtype))
            continue
        attended = attended.view(n, num_kv_heads, group, rows, head_dim).permute(0, 3, 1, 2, 4)
        attended = attended.reshape(n, rows, num_heads, head_dim)
        out[g.tokens[g.real]] = attended[g.real].to(out.dtype)
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
    x32 = _fp32(x)
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if normed.dtype != x.dtype:
        normed = normed.to(x.dtype)
    out = weight * normed
    return out if residual is None else (out, x)


def _fp32(x: torch.Tensor) -> torch.Tensor:
    """``x.float()`` without the call when it is float32 already (every call costs host time
    on each layer of each step)."""
    return x if x.dtype == torch.float32 else x.float()


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
