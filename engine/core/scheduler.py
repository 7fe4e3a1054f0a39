"""Iteration-level scheduling: which sequences compute how many tokens in the next step.

Each step: running decodes first, then running chunked prefills, then FCFS admission of
waiting sequences, all within `max_num_batched_tokens`. When blocks run out, the newest
running sequence (by arrival) is preempted by recompute: its blocks are freed and it goes
back to the head of the queue. The oldest running sequence is therefore never preempted,
so something always progresses; and no admission happens in a step that preempted, so a
victim is not readmitted straight into the same squeeze (no thrash loop).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from operator import attrgetter

from engine.config import EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.sequence import Request, ScheduledSeq, Sequence, SequenceStatus
from engine.core.stats import EngineStats
from engine.errors import RequestTooLargeError, SamplingParamsError
from engine.sampling import SamplingParams


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    num_preempted: int = 0
    # filled at commit
    sampled: list[Sequence] = field(default_factory=list)  # in sampling order
    ready_to_fork: list[Request] = field(default_factory=list)  # n > 1: prompt cached
    request_ids: list[str] = field(default_factory=list)
    num_prefill_seqs: int = 0
    num_prefill_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


_age = attrgetter("age")  # (arrival time, sequence id): older first


@dataclass(eq=False)
class Scheduler:
    config: EngineConfig
    max_model_len: int
    block_manager: BlockManager
    stats: EngineStats

    def __post_init__(self) -> None:
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # kept in age order
        self._out_of_order = False  # a readmitted or forked sequence joined out of age order
        # one persistent input-batch row per running sequence (`core/input_batch.py`)
        self._free_rows = list(range(self.config.max_num_seqs - 1, -1, -1))
        # gauges kept up to date as sequences move, so reading them is O(1)
        self.num_running_tokens = 0  # computed tokens of the running sequences
        self.num_running_blocks = 0  # block-table entries of the running sequences
        self._running_requests: dict[str, int] = {}  # request id -> its running sequences
        self._waiting_requests: dict[str, int] = {}
        # Admission keeps a little headroom so running decodes are not starved at once.
        self._watermark_blocks = max(1, self.block_manager.num_blocks // 100)

    # --- admission control -------------------------------------------------------------

    def check_fits(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        if num_prompt_tokens < 1:
            raise RequestTooLargeError("the prompt is empty: at least one token is required")
        if params.n > self.config.max_num_seqs:
            raise SamplingParamsError(
                f"n ({params.n}) exceeds max_num_seqs ({self.config.max_num_seqs}): "
                "every sample runs as its own sequence"
            )
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
        _count(self._waiting_requests, seq.request.request_id, 1)

    def request_counts(self) -> tuple[int, int]:
        """Requests with a running sequence, and requests with a waiting one."""
        return len(self._running_requests), len(self._waiting_requests)

    def add_running(self, seq: Sequence) -> None:
        """A fork joins its parent among the running sequences (its seat was reserved)."""
        self._start_running(seq)

    def _start_running(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.RUNNING
        seq.row = self._free_rows.pop()
        seq.row_is_new = True
        seq.synced_blocks = 0
        if self.running and self.running[-1].age > seq.age:
            self._out_of_order = True
        self.running.append(seq)
        self.num_running_tokens += seq.num_computed_tokens
        self.num_running_blocks += len(seq.block_table)
        _count(self._running_requests, seq.request.request_id, 1)

    def _stop_running(self, seq: Sequence) -> None:
        """Before its blocks are freed: the gauges subtract what it holds."""
        self.running.remove(seq)
        self._free_rows.append(seq.row)
        seq.row = -1
        self.num_running_tokens -= seq.num_computed_tokens
        self.num_running_blocks -= len(seq.block_table)
        _count(self._running_requests, seq.request.request_id, -1)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # --- one step ----------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Decodes first, then chunked prefills, then admissions; O(running) per step."""
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        chosen: dict[int, ScheduledSeq] = {}
        copies: dict[int, list[tuple[int, int]]] = {}
        if self._out_of_order:
            self.running.sort(key=_age)
            self._out_of_order = False

        prefills = []
        running = SequenceStatus.RUNNING
        size = self.block_manager.block_size
        blocks = self.block_manager.blocks
        max_len = self.max_model_len
        for seq in tuple(self.running):
            if budget <= 0:
                break
            if seq.status is not running:
                continue  # preempted by an older sequence this step
            computed = seq.num_computed_tokens
            pending = seq.num_pending
            num_tokens = len(seq.token_ids) + pending  # `seq.num_tokens`, inlined: hot loop
            forking = seq.request.pending_forks
            remaining = (seq.compute_target() if forking else num_tokens) - computed
            if remaining != 1:
                if remaining > 1:
                    prefills.append(seq)
                continue
            if pending and (
                seq.grammar is not None or num_tokens >= seq.token_limit or num_tokens >= max_len
            ):
                # its last token is in flight: it finishes when that lands, or (structured
                # outputs) its grammar must see it before the next token's mask is made
                continue
            table = seq.block_table
            if computed < len(table) * size and blocks[table[computed // size]].ref_count == 1:
                # the common decode: room in its own last block, nothing to allocate
                if forking or computed < seq.num_prompt_tokens:
                    entry = ScheduledSeq(seq, 1, not forking, computed < seq.num_prompt_tokens)
                else:  # the same every step: made once per sequence
                    entry = seq.decode_entry
                    if entry is None:
                        entry = seq.decode_entry = ScheduledSeq(seq, 1, True, False)
                chosen[seq.seq_id] = entry
                budget -= 1
                continue
            budget = self._schedule(seq, 1, budget, chosen, copies, out, is_decode=True)
        for seq in prefills:
            if budget <= 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            remaining = seq.compute_target() - seq.num_computed_tokens
            budget = self._schedule(seq, min(remaining, budget), budget, chosen, copies, out)

        num_running = len(chosen)
        if not out.num_preempted:
            budget = self._admit(budget, chosen, copies)

        scheduled = list(chosen.values())
        if prefills or len(scheduled) != num_running:  # else already in age order
            scheduled.sort(key=lambda item: item.seq.age)
        out.scheduled = scheduled
        if copies:
            out.block_copies = [pair for seq_copies in copies.values() for pair in seq_copies]
        return out

    def _schedule(
        self,
        seq: Sequence,
        chunk: int,
        budget: int,
        chosen: dict[int, ScheduledSeq],
        copies: dict[int, list[tuple[int, int]]],
        out: SchedulerOutput,
        is_decode: bool = False,
    ) -> int:
        """Allocate (or preempt) for one running sequence; returns the budget left."""
        table_len = len(seq.block_table)
        made = self._allocate_or_preempt(seq, chunk, chosen, copies, out, is_decode)
        budget += made[2]  # preempted sequences give their tokens back
        if made[0] is None:
            return budget
        self.num_running_blocks += len(seq.block_table) - table_len
        chunk, seq_copies = made[0], made[1]
        chosen[seq.seq_id] = self._entry(seq, chunk)
        if seq_copies:
            copies[seq.seq_id] = seq_copies
            seq.synced_blocks = 0  # a block id changed in place: rewrite the row
        return budget - chunk

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
    ) -> tuple[int | None, list[tuple[int, int]], int]:
        """(tokens, copy-on-write pairs, tokens freed by preempting chosen sequences)."""
        bm = self.block_manager
        refund = 0
        while True:
            result = bm.allocate(seq, chunk)
            if result is not None:
                return chunk, result, refund
            victim = next((s for s in reversed(self.running) if s is not seq), None)
            if victim is None or victim.age < seq.age:
                if not is_decode:
                    # An older prefill keeps its blocks and computes what still fits.
                    fit = self._tokens_that_fit(seq)
                    if fit <= 0:
                        return None, [], refund
                    chunk = min(chunk, fit)
                    continue
                refund += self._preempt(seq, chosen, copies, out)
                return None, [], refund
            refund += self._preempt(victim, chosen, copies, out)

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
    ) -> int:
        """Recompute preemption; returns the tokens `seq` had been given this step."""
        entry = chosen.pop(seq.seq_id, None)
        copies.pop(seq.seq_id, None)
        self._stop_running(seq)
        self.block_manager.free(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        _count(self._waiting_requests, seq.request.request_id, 1)
        out.num_preempted += 1
        self.stats.record_preemption()
        return 0 if entry is None else entry.num_tokens

    def _admit(
        self,
        budget: int,
        chosen: dict[int, ScheduledSeq],
        copies: dict[int, list[tuple[int, int]]],
    ) -> int:
        if not self.waiting or budget <= 0:
            return budget
        bm = self.block_manager
        # seats promised to the children of running n > 1 requests not yet forked
        reserved = sum(s.request.pending_forks for s in self.running if s.request.pending_forks)
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if seq.num_pending:
                break  # preempted with a token in flight: readmitted once it lands
            seats = 1 + seq.request.pending_forks
            if len(self.running) + reserved + seats > self.config.max_num_seqs:
                break
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
            _count(self._waiting_requests, seq.request.request_id, -1)
            if seq.scheduled_at is None:  # a preempted sequence keeps its first admission
                seq.scheduled_at = time.monotonic()
            self._start_running(seq)
            reserved += seats - 1
            chosen[seq.seq_id] = self._entry(seq, chunk)
            if seq_copies:
                copies[seq.seq_id] = seq_copies
            budget -= chunk
        return budget

    # --- after a step ------------------------------------------------------------------

    def commit(self, step: SchedulerOutput) -> None:
        """The step is launched: its tokens' K/V will be in the cache before the next one.

        Fills `step.sampled` (each now has one token in flight, `num_pending`, until the
        engine appends it), `step.ready_to_fork`, `step.request_ids` and the prefill counts.
        """
        caching = self.block_manager.enable_prefix_caching
        register = self.block_manager.register_full_blocks
        size = self.block_manager.block_size
        sampled = step.sampled
        add_sampled = sampled.append
        add_request_id = step.request_ids.append
        tokens = 0
        for item in step.scheduled:
            seq = item.seq
            request = seq.request
            add_request_id(request.request_id)
            count = item.num_tokens
            seq.num_computed_tokens = computed = seq.num_computed_tokens + count
            tokens += count
            if item.is_prefill:
                step.num_prefill_seqs += 1
                step.num_prefill_tokens += count
                if request.pending_forks and computed == seq.compute_target():
                    step.ready_to_fork.append(request)
            if item.sample:
                seq.num_pending += 1  # 2 for a moment: the step before is read back next
                seq.pending_index = len(sampled)
                add_sampled(seq)
            if caching and (len(seq.block_hashes) + 1) * size <= min(computed, len(seq.token_ids)):
                register(seq)  # a block filled up and its tokens are all on the host
        self.num_running_tokens += tokens

    def finish(self, seq: Sequence) -> None:
        if seq.row >= 0:
            self._stop_running(seq)
        elif seq.status is SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
            _count(self._waiting_requests, seq.request.request_id, -1)
        seq.status = SequenceStatus.FINISHED
        self.block_manager.free(seq)


def _count(counts: dict[str, int], key: str, delta: int) -> None:
    left = counts.get(key, 0) + delta
    if left:
        counts[key] = left
    else:
        del counts[key]
