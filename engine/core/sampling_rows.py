"""Per-row sampling settings and generated-token counts, kept where the sampler runs.

A row's settings are written once, when a sequence takes the row (`RowSetup`), instead of
being sent for every sequence every step; a step gathers its sampled rows' settings with
numpy and moves them to the device in one copy. For presence/frequency penalties the
counts of each row's generated tokens live on the device (`[max_num_seqs, vocab]` int32)
and grow by one scatter of the sampled tokens per step, so no per-sequence `Counter` ever
crosses to the device. The repetition penalty's "seen" set (prompt or output) lives there
too (`[max_num_seqs, vocab]` bool): the prompt's tokens are marked once, at row setup, and
each step's sampled tokens by the same kind of scatter. Seeded sequences keep their own
`torch.Generator` until released. A row's logit_bias is kept as its (token, bias) pairs and
sent only for steps that sample a row with one; a structured output's bitmask is made by the
engine on the host each step (`StepInputs.grammar_bitmask`, constrained rows only) and sent
in one copy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from engine.core.input_batch import RowSetup
from engine.layers.sampler import (
    CountPenalties,
    GrammarMask,
    LogitBias,
    RepetitionPenalty,
    SamplingBatch,
)

# rows of `SamplingRows.values`
TEMPERATURE, TOP_P, MIN_P, PRESENCE, FREQUENCY, TOP_K, GREEDY, REPETITION = range(8)
# rows of `SamplingRows.flags`
USES_TOP_K, USES_TOP_P, USES_MIN_P, USES_PENALTIES, SEEDED, USES_REPETITION, USES_BIAS = range(7)


class SamplingRows:
    def __init__(self, max_rows: int, vocab_size: int, device: torch.device) -> None:
        self.device = device
        self.vocab_size = vocab_size
        self.values = np.zeros((8, max_rows), dtype=np.float32)
        self.flags = np.zeros((7, max_rows), dtype=bool)
        self.num_logprobs = np.full(max_rows, -1, dtype=np.int32)  # -1: none wanted
        self.min_tokens = np.zeros(max_rows, dtype=np.int32)
        self.num_output = np.zeros(max_rows, dtype=np.int32)  # sampled so far, in flight too
        self.seq_ids = np.full(max_rows, -1, dtype=np.int64)
        self.banned: list[list[int]] = [[] for _ in range(max_rows)]
        self.bias: list[tuple[list[int], list[float]]] = [([], []) for _ in range(max_rows)]
        self.counts = torch.zeros(max_rows, vocab_size, dtype=torch.int32, device=device)
        self.seen = torch.zeros(max_rows, vocab_size, dtype=torch.bool, device=device)
        self.generators: dict[int, torch.Generator] = {}  # seeded sequences, by seq_id
        # The last step's batch (grammar aside) and its rows: a decode step samples the same
        # rows as the one before until a row changes hands, so its settings are reused.
        self._cached: _CachedBatch | None = None

    @property
    def state_bytes(self) -> int:
        """The per-row token state held on the device (penalty counts and seen sets)."""
        return sum(t.numel() * t.element_size() for t in (self.counts, self.seen))

    # --- rows changing hands -----------------------------------------------------------

    def setup(self, rows: list[RowSetup]) -> None:
        if rows:
            self._cached = None
        for setup in rows:
            row, params = setup.row, setup.params
            values, flags = self.values, self.flags
            values[TEMPERATURE, row] = 1.0 if params.greedy else params.temperature
            values[TOP_P, row] = params.top_p
            values[MIN_P, row] = params.min_p
            values[PRESENCE, row] = params.presence_penalty
            values[FREQUENCY, row] = params.frequency_penalty
            values[TOP_K, row] = params.top_k if params.top_k > 0 else self.vocab_size
            values[GREEDY, row] = 1.0 if params.greedy else 0.0
            values[REPETITION, row] = params.repetition_penalty
            flags[USES_TOP_K, row] = params.top_k > 0
            flags[USES_TOP_P, row] = params.top_p < 1.0
            flags[USES_MIN_P, row] = params.min_p > 0.0
            flags[USES_PENALTIES, row] = params.has_count_penalties
            flags[SEEDED, row] = setup.seed is not None
            flags[USES_REPETITION, row] = params.has_repetition_penalty
            flags[USES_BIAS, row] = params.has_logit_bias
            if params.has_logit_bias:  # ids past the logits' width were refused at add
                pairs = sorted(params.logit_bias.items())
                self.bias[row] = ([t for t, _ in pairs], [float(b) for _, b in pairs])
            self.num_logprobs[row] = -1 if params.logprobs is None else params.logprobs
            self.min_tokens[row] = params.min_tokens
            self.num_output[row] = setup.num_output_tokens
            self.seq_ids[row] = setup.seq_id
            self.banned[row] = setup.banned_ids
            if params.has_count_penalties:
                self.counts[row].zero_()
                if setup.output_token_ids:
                    ids = self._ids(setup.output_token_ids)
                    ones = torch.ones(len(ids), dtype=torch.int32, device=self.device)
                    self.counts[row].index_add_(0, ids, ones)
            if params.has_repetition_penalty:
                self.seen[row].zero_()
                self.seen[row, self._ids(setup.prompt_token_ids + setup.output_token_ids)] = True
            if setup.seed is not None and setup.seq_id not in self.generators:
                generator = torch.Generator(self.device).manual_seed(setup.seed)
                self.generators[setup.seq_id] = generator

    def _ids(self, token_ids: list[int]) -> torch.Tensor:
        return torch.tensor(token_ids, dtype=torch.int64).to(self.device, non_blocking=True)

    def release(self, seq_ids: list[int]) -> None:
        if seq_ids:
            self._cached = None
        for seq_id in seq_ids:
            self.generators.pop(seq_id, None)

    # --- one step ----------------------------------------------------------------------

    def batch(
        self,
        rows: np.ndarray,
        rows_on_device: torch.Tensor,
        default_generator: torch.Generator,
        grammar_positions: np.ndarray | None = None,
        grammar_bitmask: np.ndarray | None = None,
    ) -> SamplingBatch:
        """The sampled rows' settings on the device (`rows_on_device`: the same rows, int64);
        `grammar_positions` (among `rows`) and their `grammar_bitmask` for constrained rows."""
        cached = self._cached
        if cached is None or cached.rows_key != rows.tobytes():
            # its own copy of the rows: a step's input tensors are not kept past the step
            rows_on_device = rows_on_device.clone()
            cached = self._cached = self._batch(rows, rows_on_device, default_generator)
        batch = cached.batch
        if cached.uses_min_tokens:  # who is under min_tokens changes as tokens are made
            under_min = self.num_output[rows] < self.min_tokens[rows]
            banned = self._banned_mask(rows, under_min) if under_min.any() else None
            batch = replace(batch, banned=banned)
        grammar = self._grammar(grammar_positions, grammar_bitmask)
        if grammar is not None:
            batch = replace(batch, grammar=grammar)
        return batch

    def _batch(
        self, rows: np.ndarray, rows_on_device: torch.Tensor, default_generator: torch.Generator
    ) -> _CachedBatch:
        uses = self.flags[:, rows].any(axis=1)
        values = torch.from_numpy(self.values[:, rows])
        if self.device.type == "cuda":
            values = values.pin_memory().to(self.device, non_blocking=True)
        greedy = self.values[GREEDY, rows]
        all_greedy = bool(greedy.all())
        counted = repetition = None
        # the sampler gathers the rows it needs of the state tables on the device
        if uses[USES_PENALTIES]:
            presence, frequency = values[PRESENCE], values[FREQUENCY]
            counted = CountPenalties(presence, frequency, self.counts, rows_on_device)
        if uses[USES_REPETITION]:
            repetition = RepetitionPenalty(values[REPETITION], self.seen, rows_on_device)
        seeded = []
        if uses[SEEDED]:
            for position in np.flatnonzero(self.flags[SEEDED, rows]).tolist():
                seeded.append((position, self.generators[int(self.seq_ids[rows[position]])]))
        wanted = int(self.num_logprobs[rows].max()) if len(rows) else -1
        batch = SamplingBatch(
            temperatures=values[TEMPERATURE],
            greedy=values[GREEDY] > 0.5,
            all_greedy=all_greedy,
            top_k=values[TOP_K].long() if uses[USES_TOP_K] else None,
            top_p=values[TOP_P] if uses[USES_TOP_P] else None,
            min_p=values[MIN_P] if uses[USES_MIN_P] else None,
            count_penalties=counted,
            repetition=repetition,
            banned=None,
            seeded=seeded,
            default_generator=default_generator,
            num_logprobs=max(wanted, 1) if wanted >= 0 else 0,
            logit_bias=self._logit_bias(rows) if uses[USES_BIAS] else None,
        )
        return _CachedBatch(
            rows_key=rows.tobytes(),
            num_rows=len(rows),
            batch=batch,
            uses_min_tokens=bool(self.min_tokens[rows].any()),
            counts_tokens=bool(uses[USES_PENALTIES]),
            marks_seen=bool(uses[USES_REPETITION]),
        )

    def _grammar(
        self, positions: np.ndarray | None, bitmask: np.ndarray | None
    ) -> GrammarMask | None:
        if positions is None or bitmask is None or not len(positions):
            return None
        rows = torch.from_numpy(positions.astype(np.int64))
        mask = torch.from_numpy(bitmask)
        if self.device.type == "cuda":
            rows = rows.pin_memory().to(self.device, non_blocking=True)
            mask = mask.pin_memory().to(self.device, non_blocking=True)
        return GrammarMask(rows, mask)

    def _logit_bias(self, rows: np.ndarray) -> LogitBias:
        positions: list[int] = []
        token_ids: list[int] = []
        values: list[float] = []
        for position in np.flatnonzero(self.flags[USES_BIAS, rows]).tolist():
            ids, biases = self.bias[int(rows[position])]
            positions.extend([position] * len(ids))
            token_ids.extend(ids)
            values.extend(biases)
        index = torch.tensor([positions, token_ids], dtype=torch.int64).to(self.device)
        bias = torch.tensor(values, dtype=torch.float32).to(self.device)
        return LogitBias(index[0], index[1], bias)

    def _banned_mask(self, rows: np.ndarray, under_min: np.ndarray) -> torch.Tensor | None:
        """`[S, vocab]` bool: EOS and stop ids of the rows still under `min_tokens`."""
        positions: list[int] = []
        columns: list[int] = []
        for position in np.flatnonzero(under_min).tolist():
            ids = self.banned[int(rows[position])]
            positions.extend([position] * len(ids))
            columns.extend(ids)
        if not columns:
            return None
        mask = torch.zeros(len(rows), self.vocab_size, dtype=torch.bool, device=self.device)
        index = torch.tensor([positions, columns], dtype=torch.int64).to(self.device)
        mask[index[0], index[1]] = True
        return mask

    def record(self, rows: np.ndarray, rows_on_device: torch.Tensor, tokens: torch.Tensor) -> None:
        """The step sampled `tokens` for `rows` (the rows of the last `batch`): count and mark
        them on the device (penalties).

        Rows without the penalty are written too (one scatter, no host-side selection):
        `setup` clears a row's state before a sequence that uses it."""
        self.num_output[rows] += 1
        cached = self._cached
        assert cached is not None and cached.num_rows == len(rows), "record follows batch"
        if cached.counts_tokens:
            ones = torch.ones_like(tokens, dtype=torch.int32)
            self.counts.index_put_((rows_on_device, tokens), ones, accumulate=True)
        if cached.marks_seen:
            self.seen[rows_on_device, tokens] = True


@dataclass
class _CachedBatch:
    rows_key: bytes  # the rows' bytes: compared with the next step's
    num_rows: int
    batch: SamplingBatch  # without a grammar mask or min_tokens bans (made per step)
    uses_min_tokens: bool  # a row has min_tokens: its bans are checked every step
    counts_tokens: bool  # presence/frequency penalties: `record` counts the tokens
    marks_seen: bool  # repetition penalty: `record` marks the tokens seen
