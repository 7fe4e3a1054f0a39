"""Iteration-level scheduling: which sequences compute how many tokens in the next step.

Each step: running decodes first, then running chunked prefills, then FCFS admission of
waiting sequences, all within `max_num_batched_tokens`. When blocks run out, the newest
running sequence (by arrival) is preempted by recompute: its blocks are freed and it goes
back to the head of the queue. The oldest running sequence is therefore never preempted,
so something always progresses; and no admission happens in a step that preempted, so a
victim is not readmitted straight into the same squeeze (no thrash loop).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.sequence import Sequence, SequenceStatus
from engine.core.stats import EngineStats
from engine.errors import RequestTooLargeError
from engine.sampling import SamplingParams


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_tokens: int  # new tokens computed this step
    sample: bool  # this chunk reaches the end, so a token is sampled
    is_prefill: bool


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    num_preempted: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


def _age(seq: Sequence) -> tuple[float, int]:
    return (seq.request.arrival_time, seq.index)


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        max_model_len: int,
        block_manager: BlockManager,
        stats: EngineStats,
    ) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.block_manager = block_manager
        self.stats = stats
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # Admission keeps a little headroom so running decodes are not starved at once.
        self._watermark_blocks = max(1, block_manager.num_blocks // 100)

    # --- admission control -------------------------------------------------------------

    def check_fits(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        if num_prompt_tokens < 1:
            raise RequestTooLargeError("the prompt is empty: at least one token is required")
        total = num_prompt_tokens + params.max_tokens
        if total > self.max_model_len:
            raise RequestTooLargeError(
                f"prompt ({num_prompt_tokens} tokens) + max_tokens ({params.max_tokens}) = "
                f"{total} exceeds max_model_len ({self.max_model_len})"
            )
        blocks = self.block_manager.blocks_needed(total)
        if blocks > self.block_manager.num_blocks:
            raise RequestTooLargeError(
                f"prompt + max_tokens = {total} tokens needs {blocks} KV blocks, more than the "
                f"whole KV cache ({self.block_manager.num_blocks} blocks of "
                f"{self.block_manager.block_size}); lower max_tokens or raise kv cache size"
            )
        if not self.config.enable_chunked_prefill and total > self.config.max_num_batched_tokens:
            raise RequestTooLargeError(
                f"without chunked prefill, prompt + max_tokens ({total}) must not exceed "
                f"max_num_batched_tokens ({self.config.max_num_batched_tokens})"
            )

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """A fork joins its parent among the running sequences."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # --- one step ----------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        chosen: dict[int, ScheduledSeq] = {}
        copies: dict[int, list[tuple[int, int]]] = {}
        self.running.sort(key=_age)

        for want_decode in (True, False):
            for seq in list(self.running):
                if budget <= 0:
                    break
                if seq.status is not SequenceStatus.RUNNING or seq.seq_id in chosen:
                    continue
                remaining = seq.compute_target() - seq.num_computed_tokens
                if remaining <= 0 or (remaining == 1) != want_decode:
                    continue
                chunk = min(remaining, budget)
                made = self._allocate_or_preempt(seq, chunk, chosen, copies, out, want_decode)
                if made is None:
                    continue
                chunk, seq_copies = made
                chosen[seq.seq_id] = self._entry(seq, chunk)
                copies[seq.seq_id] = seq_copies
                # recounted, since a preemption may have dropped an already chosen sequence
                budget = self.config.max_num_batched_tokens - sum(
                    c.num_tokens for c in chosen.values()
                )

        if not out.num_preempted:
            budget = self._admit(budget, chosen, copies)

        out.scheduled = sorted(chosen.values(), key=lambda s: _age(s.seq))
        out.block_copies = [pair for seq_copies in copies.values() for pair in seq_copies]
        return out

    def _entry(self, seq: Sequence, chunk: int) -> ScheduledSeq:
        end = seq.num_computed_tokens + chunk
        sample = end == seq.num_tokens and end == seq.compute_target()
        return ScheduledSeq(
            seq, chunk, sample, is_prefill=end <= seq.num_prompt_tokens or chunk > 1
        )

    def _allocate_or_preempt(
        self,
        seq: Sequence,
        chunk: int,
        chosen: dict[int, ScheduledSeq],
        copies: dict[int, list[tuple[int, int]]],
        out: SchedulerOutput,
        is_decode: bool,
    ) -> tuple[int, list[tuple[int, int]]] | None:
        bm = self.block_manager
        while True:
            result = bm.allocate(seq, chunk)
            if result is not None:
                return chunk, result
            others = [s for s in self.running if s is not seq]
            victim = max(others, key=_age, default=None)
            if victim is None or _age(victim) < _age(seq):
                if not is_decode:
                    # An older prefill keeps its blocks and computes what still fits.
                    fit = self._tokens_that_fit(seq)
                    if fit <= 0:
                        return None
                    chunk = min(chunk, fit)
                    continue
                self._preempt(seq, chosen, copies, out)
                return None
            self._preempt(victim, chosen, copies, out)

    def _tokens_that_fit(self, seq: Sequence) -> int:
        bm = self.block_manager
        size = bm.block_size
        slack = len(seq.block_table) * size - seq.num_computed_tokens
        first_written = seq.num_computed_tokens // size
        shared = (
            first_written < len(seq.block_table)
            and bm.ref_count(seq.block_table[first_written]) > 1
        )
        return slack + (bm.num_free_blocks - int(shared)) * size

    def _preempt(
        self,
        seq: Sequence,
        chosen: dict[int, ScheduledSeq],
        copies: dict[int, list[tuple[int, int]]],
        out: SchedulerOutput,
    ) -> None:
        chosen.pop(seq.seq_id, None)
        copies.pop(seq.seq_id, None)
        self.block_manager.free(seq)
        seq.reset_for_recompute()
        self.running.remove(seq)
        self.waiting.appendleft(seq)
        out.num_preempted += 1
        self.stats.record_preemption()

    def _admit(
        self,
        budget: int,
        chosen: dict[int, ScheduledSeq],
        copies: dict[int, list[tuple[int, int]]],
    ) -> int:
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            target = seq.compute_target()
            hits = bm.match_prefix(seq, max(target - 1, 0))
            remaining = target - seq.num_computed_tokens
            chunk = min(remaining, budget)
            needed = bm.blocks_needed(seq.num_computed_tokens + chunk) - len(seq.block_table)
            headroom = self._watermark_blocks if self.running else 0
            too_big = not self.config.enable_chunked_prefill and chunk < remaining
            if too_big or needed + headroom > bm.num_free_blocks:
                bm.free(seq)
                seq.reset_for_recompute()
                break
            seq_copies = bm.allocate(seq, chunk)
            assert seq_copies is not None  # free blocks were checked just above
            bm.count_prefix_lookup(max(target - 1, 0), hits)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            chosen[seq.seq_id] = self._entry(seq, chunk)
            copies[seq.seq_id] = seq_copies
            budget -= chunk
        return budget

    # --- after a step ------------------------------------------------------------------

    def commit(self, scheduled: list[ScheduledSeq]) -> None:
        """The step ran: its tokens' K/V are in the cache."""
        for item in scheduled:
            item.seq.num_computed_tokens += item.num_tokens
            self.block_manager.register_full_blocks(item.seq)

    def finish(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.FINISHED
        self.block_manager.free(seq)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
