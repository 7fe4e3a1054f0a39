"""Triton paged attention: decode, prefill and chunked prefill in one kernel family.

Contract: ``engine.kernels.reference.paged_attention_ref``. The main kernel runs one program
per (sequence, block of new tokens, KV head[, KV split]); the program holds every query head of
its KV head's group, so each K/V tile is read once per group (GQA). K/V are read through the
block table one position at a time, so the KV tile size is independent of the cache block
size. Softmax is online and in fp32. With ``num_kv_splits > 1`` (flash-decoding) each program
covers one slice of the context and a reduce kernel merges the slices; that keeps the GPU busy
when a few sequences have long contexts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cache, cached_property

import torch
import triton
import triton.language as tl

from engine.kernels.launch_args import check_kv_caches, unit_stride
from engine.kernels.reference import AttentionMetadata

LOG2_E = 1.4426950408889634
# Below this many KV positions per split, splitting costs more than it hides.
MIN_TOKENS_PER_SPLIT = 256
MAX_KV_SPLITS = 16


@triton.jit
def _shift_of(row_max):
    # A row that has seen nothing yet keeps -inf; shift by 0 so exp2 gives 0, not NaN.
    return tl.where(row_max == float("-inf"), 0.0, row_max)


@triton.jit
def _normalized(acc, total):
    # A row that saw no key (padding) sums to 0 and stays 0.
    return acc / tl.where(total == 0.0, 1.0, total)[:, None]


@triton.jit
def _paged_attention_kernel(
    query_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    cu_seqlens_q_ptr,
    context_lens_ptr,
    out_ptr,
    partial_out_ptr,
    partial_max_ptr,
    partial_sum_ptr,
    scale_log2,
    stride_q_token,
    stride_q_head,
    stride_cache_block,
    stride_cache_offset,
    stride_cache_head,
    stride_table_seq,
    stride_out_token,
    stride_out_head,
    stride_partial_split,
    stride_partial_token,
    stride_stat_split,
    stride_stat_token,
    block_size,
    head_dim,
    num_heads,
    GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
    TILE_KV: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    q_block = tl.program_id(1)
    kv_head = tl.program_id(2) // NUM_SPLITS
    split = tl.program_id(2) % NUM_SPLITS

    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    context_len = tl.load(context_lens_ptr + seq)
    if q_block * BLOCK_Q >= q_len:
        return

    # Row r of the tile is new token r // GROUP_P2 and query head r % GROUP_P2 of the group.
    rows = tl.arange(0, BLOCK_M)
    token_in_seq = q_block * BLOCK_Q + rows // GROUP_P2
    head = kv_head * GROUP + rows % GROUP_P2
    row_valid = (token_in_seq < q_len) & (rows % GROUP_P2 < GROUP)
    position = context_len - q_len + token_in_seq
    dims = tl.arange(0, BLOCK_DIM)
    dim_valid = dims < head_dim

    token = (q_start + token_in_seq).to(tl.int64)
    q_offsets = token[:, None] * stride_q_token + head[:, None] * stride_q_head + dims[None, :]
    q = tl.load(query_ptr + q_offsets, mask=row_valid[:, None] & dim_valid[None, :], other=0.0)

    # The last new token of this block bounds the causal window; a split takes its slice.
    last_token = tl.minimum(q_block * BLOCK_Q + BLOCK_Q, q_len) - 1
    kv_end = tl.minimum(context_len, context_len - q_len + last_token + 1)
    num_tiles = tl.cdiv(kv_end, TILE_KV)
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    first_tile = split * tiles_per_split
    last_tile = tl.minimum(first_tile + tiles_per_split, num_tiles)

    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DIM], dtype=tl.float32)
    kv_offsets = tl.arange(0, TILE_KV)
    table_row = block_tables_ptr + seq * stride_table_seq
    head_offset = kv_head * stride_cache_head

    for tile in range(first_tile, last_tile):
        kv_pos = tile * TILE_KV + kv_offsets
        kv_valid = kv_pos < kv_end
        physical_block = tl.load(table_row + kv_pos // block_size, mask=kv_valid, other=0)
        slot_offsets = (
            physical_block.to(tl.int64) * stride_cache_block
            + (kv_pos % block_size) * stride_cache_offset
            + head_offset
        )
        kv_mask = kv_valid[:, None] & dim_valid[None, :]
        k = tl.load(k_cache_ptr + slot_offsets[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + slot_offsets[:, None] + dims[None, :], mask=kv_mask, other=0.0)

        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        visible = kv_valid[None, :] & (kv_pos[None, :] <= position[:, None])
        scores = tl.where(visible, scores, float("-inf"))

        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        shift = _shift_of(new_max)
        probs = tl.math.exp2(scores - shift[:, None])
        rescale = tl.math.exp2(row_max - shift)
        row_sum = row_sum * rescale + tl.sum(probs, axis=1)
        acc = acc * rescale[:, None]
        acc += tl.dot(probs.to(v.dtype), v, input_precision=DOT_PRECISION)
        row_max = new_max

    out_mask = row_valid[:, None] & dim_valid[None, :]
    if NUM_SPLITS == 1:
        result = _normalized(acc, row_sum)
        out_offsets = token[:, None] * stride_out_token + head[:, None] * stride_out_head
        tl.store(
            out_ptr + out_offsets + dims[None, :],
            result.to(out_ptr.dtype.element_ty),
            mask=out_mask,
        )
    else:
        partial_offsets = split * stride_partial_split + token[:, None] * stride_partial_token
        partial_offsets = partial_offsets + head[:, None] * BLOCK_DIM + dims[None, :]
        tl.store(partial_out_ptr + partial_offsets, acc, mask=out_mask)
        stat_offsets = split * stride_stat_split + token * stride_stat_token + head
        tl.store(partial_max_ptr + stat_offsets, row_max, mask=row_valid)
        tl.store(partial_sum_ptr + stat_offsets, row_sum, mask=row_valid)


@triton.jit
def _reduce_splits_kernel(
    cu_seqlens_q_ptr,
    out_ptr,
    partial_out_ptr,
    partial_max_ptr,
    partial_sum_ptr,
    stride_out_token,
    stride_out_head,
    stride_partial_split,
    stride_partial_token,
    stride_stat_split,
    stride_stat_token,
    num_heads,
    head_dim,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    # One program per new token: merge the splits' (max, sum, acc) for all its heads.
    seq = tl.program_id(0)
    token_in_seq = tl.program_id(1)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    if token_in_seq >= q_len:
        return
    token = (q_start + token_in_seq).to(tl.int64)
    heads = tl.arange(0, BLOCK_HEADS)
    dims = tl.arange(0, BLOCK_DIM)
    head_valid = heads < num_heads
    mask = head_valid[:, None] & (dims[None, :] < head_dim)

    global_max = tl.full([BLOCK_HEADS], float("-inf"), dtype=tl.float32)
    for split in range(NUM_SPLITS):
        stat_offsets = split * stride_stat_split + token * stride_stat_token + heads
        split_max = tl.load(partial_max_ptr + stat_offsets, mask=head_valid, other=float("-inf"))
        global_max = tl.maximum(global_max, split_max)
    shift = _shift_of(global_max)

    total = tl.zeros([BLOCK_HEADS], dtype=tl.float32)
    acc = tl.zeros([BLOCK_HEADS, BLOCK_DIM], dtype=tl.float32)
    for split in range(NUM_SPLITS):
        stat_offsets = split * stride_stat_split + token * stride_stat_token + heads
        split_max = tl.load(partial_max_ptr + stat_offsets, mask=head_valid, other=float("-inf"))
        split_sum = tl.load(partial_sum_ptr + stat_offsets, mask=head_valid, other=0.0)
        weight = tl.math.exp2(split_max - shift)
        partial_offsets = split * stride_partial_split + token * stride_partial_token
        partial_offsets = partial_offsets + heads[:, None] * BLOCK_DIM + dims[None, :]
        split_acc = tl.load(partial_out_ptr + partial_offsets, mask=mask, other=0.0)
        total += weight * split_sum
        acc += weight[:, None] * split_acc

    result = _normalized(acc, total)
    out_offsets = token * stride_out_token + heads[:, None] * stride_out_head + dims[None, :]
    tl.store(out_ptr + out_offsets, result.to(out_ptr.dtype.element_ty), mask=mask)


def choose_num_kv_splits(
    num_seqs: int, num_kv_heads: int, max_query_len: int, max_context_len: int, device: torch.device
) -> int:
    """Split the KV range only for short queries whose grid would leave most SMs idle."""
    if device.type != "cuda" or max_query_len > 16:
        return 1
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    programs = max(1, num_seqs * num_kv_heads)
    wanted = triton.cdiv(2 * num_sms, programs)
    useful = max_context_len // MIN_TOKENS_PER_SPLIT
    return max(1, min(wanted, useful, MAX_KV_SPLITS))


@dataclass(frozen=True)
class _Tiling:
    """The main kernel's tile shape: each field is the constexpr of its upper-case name."""

    group: int  # query heads per KV head
    group_p2: int  # the group padded to a power of two
    block_q: int  # new tokens per program
    block_m: int  # tile rows: block_q tokens x group_p2 heads
    block_dim: int  # head_dim padded to a power of two
    tile_kv: int  # KV positions per iteration

    @cached_property
    def constexprs(self) -> dict[str, int]:
        return {name.upper(): value for name, value in asdict(self).items()}


def _choose_tiling(query: torch.Tensor, num_kv_heads: int, max_query_len: int) -> _Tiling:
    group = query.shape[1] // num_kv_heads
    # tl.dot needs at least 16 rows; decode fills them with the group's heads (and padding).
    few_rows = max_query_len * triton.next_power_of_2(group) <= 16
    return _tiling(group, query.shape[2], query.element_size(), few_rows)


@cache  # a launch per layer per step: the handful of shapes are worked out once
def _tiling(group: int, head_dim: int, element_size: int, few_rows: bool) -> _Tiling:
    group_p2 = triton.next_power_of_2(group)
    block_dim = triton.next_power_of_2(head_dim)
    block_m = max(16 if few_rows else 64, group_p2)
    # fp32 tiles are twice the bytes: halve them to stay within shared memory.
    tile_kv = 64 if block_dim <= 128 and element_size <= 2 else 32
    return _Tiling(group, group_p2, block_m // group_p2, block_m, block_dim, tile_kv)


def _check_inputs(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
) -> None:
    if query.dim() != 3 or k_cache.dim() != 4:
        raise ValueError(
            "query must be [tokens, heads, dim] and k_cache [blocks, size, heads, dim]"
        )
    check_kv_caches(k_cache, v_cache)
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"cache head_dim {k_cache.shape[3]} != query head_dim {head_dim}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    num_seqs = meta.context_lens.shape[0]
    if meta.cu_seqlens_q.shape != (num_seqs + 1,):
        got = tuple(meta.cu_seqlens_q.shape)
        raise ValueError(f"cu_seqlens_q must be [{num_seqs + 1}], got {got}")
    if meta.block_tables.dim() != 2 or meta.block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables must be [{num_seqs}, max_blocks]")


def paged_attention_triton(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Same contract as ``paged_attention_ref``; returns ``[num_tokens, num_heads, head_dim]``.

    ``meta.max_query_len`` (the longest run of new tokens of any sequence) sizes the grid; set
    it to avoid a device-to-host sync. ``meta.num_kv_splits`` forces the flash-decoding split
    count (``None`` picks one from the batch shape; ``1`` disables splitting).
    """
    _check_inputs(query, k_cache, v_cache, meta)
    block_tables, cu_seqlens_q = meta.block_tables, meta.cu_seqlens_q
    max_query_len, num_kv_splits = meta.max_query_len, meta.num_kv_splits
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs = meta.context_lens.shape[0]
    # Rows no sequence claims (e.g. graph padding) stay zero, as in the reference.
    out = torch.zeros_like(query)
    if num_tokens == 0 or num_seqs == 0:
        return out
    query = unit_stride(query)
    if max_query_len is None:
        max_query_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max().item())
    if max_query_len <= 0:
        return out

    tiling = _choose_tiling(query, num_kv_heads, max_query_len)
    block_dim = tiling.block_dim
    if num_kv_splits is None:
        max_context_len = block_tables.shape[1] * block_size
        num_kv_splits = choose_num_kv_splits(
            num_seqs, num_kv_heads, max_query_len, max_context_len, query.device
        )
    num_kv_splits = max(1, int(num_kv_splits))
    dot_precision = "ieee" if query.dtype == torch.float32 else "tf32"

    if num_kv_splits > 1:
        partial_out = torch.empty(
            (num_kv_splits, num_tokens, num_heads, block_dim),
            dtype=torch.float32,
            device=query.device,
        )
        partial_max = torch.empty(
            (num_kv_splits, num_tokens, num_heads), dtype=torch.float32, device=query.device
        )
        partial_sum = torch.empty_like(partial_max)
    else:
        # Unused by the single-pass variant; any valid pointer will do.
        partial_out = partial_max = partial_sum = out
    # out (token, head), partial out (split, token), partial stats (split, token): both
    # kernels take these strides, in this order
    split_strides = (*out.stride()[:2], *partial_out.stride()[:2], *partial_max.stride()[:2])

    grid = (num_seqs, triton.cdiv(max_query_len, tiling.block_q), num_kv_heads * num_kv_splits)
    _paged_attention_kernel[grid](
        query,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        meta.context_lens,
        out,
        partial_out,
        partial_max,
        partial_sum,
        scale * LOG2_E,
        query.stride(0),
        query.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        *split_strides,
        block_size,
        head_dim,
        num_heads,
        **tiling.constexprs,
        NUM_SPLITS=num_kv_splits,
        DOT_PRECISION=dot_precision,
    )
    if num_kv_splits > 1:
        _reduce_splits_kernel[(num_seqs, max_query_len)](
            cu_seqlens_q,
            out,
            partial_out,
            partial_max,
            partial_sum,
            *split_strides,
            num_heads,
            head_dim,
            BLOCK_HEADS=triton.next_power_of_2(num_heads),
            BLOCK_DIM=block_dim,
            NUM_SPLITS=num_kv_splits,
        )
    return out
