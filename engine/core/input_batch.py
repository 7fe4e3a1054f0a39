"""The step's inputs, built on the host from persistent per-row buffers (no per-step rebuild).

Every running sequence owns a row (`Sequence.row`, handed out by the scheduler). The
block tables live in one `[max_num_seqs, max_blocks_per_seq]` int32 array and a row is
written only where its table grew (or whole, after a copy-on-write or when the row is new);
a step gathers the rows it runs. Positions and slots are computed with numpy from the
rows, so the per-sequence Python work is a handful of list appends.

`StepInputs` is what every rank receives: numpy arrays (cheap to pickle for tensor
parallelism), plus the rows that changed hands (`new_rows`) so the sampler can keep
per-row settings and token counts on the device instead of being sent them every step.
With asynchronous scheduling a decode's input token may still be on the device: its slot
in `input_ids` is filled there from the previous step's sampled tokens
(`prev_token_positions` / `prev_token_indices`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.core.scheduler import SchedulerOutput
from engine.core.sequence import Sequence
from engine.sampling import SamplingParams
from engine.structured.matcher import GrammarMatcher, fill_bitmask

_EMPTY = np.zeros(0, dtype=np.int32)


@dataclass
class RowSetup:
    """A sequence takes a row: what the sampler keeps for it until the row changes hands."""

    row: int
    seq_id: int
    params: SamplingParams
    seed: int | None  # the request's seed + the sample's index; None: unseeded
    num_output_tokens: int  # generated so far (a readmitted sequence keeps its tokens)
    output_token_ids: list[int]  # those tokens, when penalties need their counts
    prompt_token_ids: list[int]  # only with the repetition penalty (its "seen" set)
    banned_ids: list[int]  # EOS and stop ids: banned while under min_tokens


@dataclass
class StepInputs:
    """One step: what every rank needs, and nothing that lives on a device."""

    input_ids: np.ndarray  # [T] int32; prev-step tokens are placeholders (see below)
    positions: np.ndarray  # [T] int32
    slot_mapping: np.ndarray  # [T] int32
    cu_seqlens_q: np.ndarray  # [B + 1] int32
    context_lens: np.ndarray  # [B] int32
    block_tables: np.ndarray  # [B, W] int32, W = blocks of the longest context
    max_query_len: int
    max_context_len: int
    logits_indices: np.ndarray  # [S] int32: token rows projected to logits
    sample_rows: np.ndarray  # [S] int32: the persistent rows of the sampled sequences
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write
    new_rows: list[RowSetup] = field(default_factory=list)
    released_seq_ids: list[int] = field(default_factory=list)  # seeded and done
    prev_token_positions: np.ndarray = field(default_factory=lambda: _EMPTY)
    prev_token_indices: np.ndarray = field(default_factory=lambda: _EMPTY)
    # every input token is the previous step's sampled token at the same index (a steady
    # decode): the device takes those tokens as they are, without the gather
    inputs_are_last_sampled: bool = False
    # structured outputs: the constrained rows' positions among the sampled rows and their
    # allowed tokens ([k, ceil(vocab / 32)] int32 bits), filled by the engine after `build`
    grammar_positions: np.ndarray = field(default_factory=lambda: _EMPTY)
    grammar_bitmask: np.ndarray | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_sampled(self) -> int:
        return len(self.sample_rows)


class InputBatch:
    """Persistent host buffers of the running sequences and the step builder over them."""

    def __init__(
        self,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        block_size: int,
        eos_token_ids: frozenset[int],
        vocab_size: int,
    ) -> None:
        self.block_size = block_size
        self.block_tables = np.zeros((max_num_seqs, max_blocks_per_seq), dtype=np.int32)
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size
        # structured outputs: each row's grammar matcher (set when the row changes hands), and
        # which rows have one, so a step finds its constrained rows with one numpy gather
        self.matchers: list[GrammarMatcher | None] = [None] * max_num_seqs
        self.constrained = np.zeros(max_num_seqs, dtype=bool)
        self.num_constrained = 0  # rows whose latest sequence has a grammar
        self.num_bitmask_words = -(-vocab_size // 32)

    def build(self, step: SchedulerOutput, released_seq_ids: list[int]) -> StepInputs:
        tables = self.block_tables
        rows: list[int] = []
        starts: list[int] = []
        input_ids: list[int] = []
        sampled: list[int] = []  # batch positions of the sampled sequences
        prev_positions: list[int] = []
        prev_indices: list[int] = []
        new_rows: list[RowSetup] = []
        add_row, add_start, add_id = rows.append, starts.append, input_ids.append
        all_single = True
        in_order = True
        num_tokens = 0
        for position, item in enumerate(step.scheduled):
            seq = item.seq
            row = seq.row
            table = seq.block_table
            if len(table) != seq.synced_blocks:
                synced = seq.synced_blocks
                tables[row, synced : len(table)] = table[synced:]
                seq.synced_blocks = len(table)
            if seq.row_is_new:
                new_rows.append(self._row_setup(seq))
                self.matchers[row] = seq.grammar
                constrained = seq.grammar is not None
                self.num_constrained += constrained - bool(self.constrained[row])
                self.constrained[row] = constrained
                seq.row_is_new = False
            start = seq.num_computed_tokens
            count = item.num_tokens
            add_row(row)
            add_start(start)
            if count == 1:
                token_ids = seq.token_ids
                if start < len(token_ids):
                    add_id(token_ids[start])
                else:  # sampled last step, still on the device
                    in_order = in_order and seq.pending_index == num_tokens
                    prev_positions.append(num_tokens)
                    prev_indices.append(seq.pending_index)
                    add_id(0)
            else:
                all_single = False
                input_ids.extend(seq.token_ids[start : start + count])
            num_tokens += count
            if item.sample:
                sampled.append(position)

        rows_np = np.array(rows, dtype=np.int32)
        starts_np = np.array(starts, dtype=np.int32)
        size = self.block_size
        if all_single:
            positions = starts_np
            token_rows = rows_np
            context_lens = starts_np + 1
            cu_seqlens = np.arange(len(rows) + 1, dtype=np.int32)
            max_query_len = 1
        else:
            lens = np.array([item.num_tokens for item in step.scheduled], dtype=np.int32)
            cu_seqlens = np.zeros(len(rows) + 1, dtype=np.int32)
            np.cumsum(lens, out=cu_seqlens[1:])
            token_rows = np.repeat(rows_np, lens)
            offsets = np.repeat(starts_np - cu_seqlens[:-1], lens)
            positions = (np.arange(cu_seqlens[-1], dtype=np.int32) + offsets).astype(np.int32)
            context_lens = starts_np + lens
            max_query_len = int(lens.max())
        blocks, in_block = np.divmod(positions, size)
        slots = tables[token_rows, blocks] * size + in_block
        max_context_len = int(context_lens.max())
        width = -(-max_context_len // size)
        if len(sampled) == len(rows):  # every sequence samples (a decode step)
            sample_rows, logits_indices = rows_np, cu_seqlens[1:] - 1
        else:
            sampled_np = np.array(sampled, dtype=np.int32)
            sample_rows, logits_indices = rows_np[sampled_np], cu_seqlens[1:][sampled_np] - 1
        inputs = StepInputs(
            input_ids=np.array(input_ids, dtype=np.int32),
            positions=positions,
            slot_mapping=slots.astype(np.int32, copy=False),
            cu_seqlens_q=cu_seqlens,
            context_lens=context_lens.astype(np.int32, copy=False),
            block_tables=tables[rows_np, :width],
            max_query_len=max_query_len,
            max_context_len=max_context_len,
            logits_indices=logits_indices,
            sample_rows=sample_rows,
            block_copies=step.block_copies,
            new_rows=new_rows,
            released_seq_ids=list(released_seq_ids),
        )
        if prev_positions:
            inputs.prev_token_positions = np.array(prev_positions, dtype=np.int32)
            inputs.prev_token_indices = np.array(prev_indices, dtype=np.int32)
            inputs.inputs_are_last_sampled = in_order and len(prev_positions) == num_tokens
        if self.num_constrained:
            constrained = np.flatnonzero(self.constrained[sample_rows])
            if len(constrained):
                self._fill_grammar(inputs, constrained)
        return inputs

    def _fill_grammar(self, inputs: StepInputs, positions: np.ndarray) -> None:
        """The constrained rows' allowed next tokens, from their matchers (which have seen
        every token so far: the scheduler runs a constrained sequence only once its last
        token is on the host)."""
        matchers = [self.matchers[row] for row in inputs.sample_rows[positions].tolist()]
        bitmask = np.zeros((len(positions), self.num_bitmask_words), dtype=np.int32)
        fill_bitmask(matchers, bitmask)  # type: ignore[arg-type]
        inputs.grammar_positions = positions.astype(np.int32)
        inputs.grammar_bitmask = bitmask

    def _row_setup(self, seq: Sequence) -> RowSetup:
        params = seq.params
        banned: list[int] = []
        if params.min_tokens:
            banned = sorted(
                t for t in {*self.eos_token_ids, *params.stop_token_ids} if t < self.vocab_size
            )
        return RowSetup(
            row=seq.row,
            seq_id=seq.seq_id,
            params=params,
            seed=None if params.seed is None else params.seed + seq.index,
            num_output_tokens=seq.num_output_tokens,
            output_token_ids=seq.output_token_ids if params.has_penalties else [],
            prompt_token_ids=(
                seq.request.prompt_token_ids if params.has_repetition_penalty else []
            ),
            banned_ids=banned,
        )
