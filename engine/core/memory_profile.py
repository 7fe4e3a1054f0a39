"""Sizing the KV pool on CUDA: what a worst-case step needs besides the weights and the pool.

The profiling step is a real one, through the same paged path as serving (the
`max_num_batched_tokens` tokens split over up to `max_num_seqs` sequences, each on its own
blocks of a temporary cache) so no O(T^2) attention fallback inflates the peak. Its
sampling covers `max_num_seqs` rows with every option on (penalties, the repetition
penalty, `min_tokens` bans, top-k, top-p, min-p, 20 logprobs), so the sampler's
`[max_num_seqs, vocab]` fp32 temporaries are part of the measured peak. The CUDA-graph pool, which only exists after the
pool is allocated, is estimated from eager runs of the decode buffers (the largest
capture's peak plus every graph's retained output) and checked against the real capture.
"""

from __future__ import annotations

import numpy as np

from engine.core.input_batch import RowSetup, StepInputs
from engine.sampling import SamplingParams


def profile_step_inputs(
    max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int, block_size: int
) -> tuple[StepInputs, int]:
    """The profiling step and the number of KV blocks it writes (blocks 0 .. n-1)."""
    num_seqs = max(1, min(max_num_seqs, max_num_batched_tokens))
    num_tokens = min(max_num_batched_tokens, num_seqs * max_model_len)
    lens = np.full(num_seqs, num_tokens // num_seqs, dtype=np.int32)
    lens[: num_tokens % num_seqs] += 1
    lens = lens[lens > 0]
    num_seqs = len(lens)
    cu_seqlens = np.zeros(num_seqs + 1, dtype=np.int32)
    np.cumsum(lens, out=cu_seqlens[1:])
    blocks_per_seq = -(-lens // block_size)
    first_block = np.zeros(num_seqs, dtype=np.int32)
    np.cumsum(blocks_per_seq[:-1], out=first_block[1:])
    width = int(blocks_per_seq.max())
    block_tables = first_block[:, None] + np.arange(width, dtype=np.int32)[None, :]
    positions = np.arange(num_tokens, dtype=np.int32) - np.repeat(cu_seqlens[:-1], lens)
    token_seq = np.repeat(np.arange(num_seqs), lens)
    slots = block_tables[token_seq, positions // block_size] * block_size
    slots += positions % block_size
    last_tokens = cu_seqlens[1:] - 1
    # every row of the sampler, even when fewer sequences than max_num_seqs fit the budget
    logits_indices = last_tokens[np.arange(max_num_seqs) % num_seqs]
    inputs = StepInputs(
        input_ids=np.zeros(num_tokens, dtype=np.int32),
        positions=positions.astype(np.int32),
        slot_mapping=slots.astype(np.int32),
        cu_seqlens_q=cu_seqlens,
        context_lens=lens.copy(),
        block_tables=block_tables.astype(np.int32),
        max_query_len=int(lens.max()),
        max_context_len=int(lens.max()),
        logits_indices=logits_indices.astype(np.int32),
        sample_rows=np.arange(max_num_seqs, dtype=np.int32),
        new_rows=profile_row_setups(max_num_seqs),
    )
    return inputs, int(blocks_per_seq.sum())


def profile_grammar(inputs: StepInputs, vocab_size: int) -> None:
    """Every sampled row but one under a grammar mask (all tokens allowed): the masked add's
    temporaries at their largest (the `index_add_` path, not the every-row add)."""
    count = max(len(inputs.sample_rows) - 1, 1)
    inputs.grammar_positions = np.arange(count, dtype=np.int32)
    inputs.grammar_bitmask = np.full((count, -(-vocab_size // 32)), -1, dtype=np.int32)


def profile_row_setups(max_num_seqs: int) -> list[RowSetup]:
    """Every sampling option on, so every sampler temporary is allocated."""
    params = SamplingParams(
        temperature=0.7,
        top_p=0.9,
        top_k=50,
        min_p=0.05,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        repetition_penalty=1.1,
        logprobs=20,
        min_tokens=1,
        max_tokens=1,
        logit_bias={0: 0.5},
    )
    return [
        RowSetup(
            row=row,
            seq_id=-1 - row,
            params=params,
            seed=None,
            num_output_tokens=0,
            output_token_ids=[0],
            prompt_token_ids=[0],
            banned_ids=[0],
        )
        for row in range(max_num_seqs)
    ]


def kv_pool_bytes(
    total: int, utilization: float, in_use: int, activation_peak: int, graph_pool: int
) -> int:
    """What the KV pool may take: the allowance less what is held and what steps will need."""
    return int(total * utilization) - in_use - activation_peak - graph_pool


def graph_pool_estimate(capture_peaks: list[int], output_bytes: list[int]) -> int:
    """Graphs share one pool captured largest first: its peak, plus every kept output."""
    return max(capture_peaks, default=0) + sum(output_bytes)
