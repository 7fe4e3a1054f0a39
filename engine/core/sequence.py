"""A request and its sequences as the step thread sees them: token ids and KV bookkeeping.

What the client sees (text, emitted offsets, stop strings) lives in the output processor
(`core/output_processor.py`), off the step thread. A sequence holds a row of the persistent
input batch while it runs (`row`), and between steps at most one token that was sampled on
the device but has not reached the host yet (`num_pending`, asynchronous scheduling).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.sampling import SamplingParams

if TYPE_CHECKING:
    from engine.core.request_state import RequestState
    from engine.structured.compiler import CompiledGrammar
    from engine.structured.matcher import GrammarMatcher


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(
        self,
        seq_id: int,
        request: Request,
        index: int,
        eos_token_ids: frozenset[int] = frozenset(),
    ) -> None:
        self.seq_id = seq_id
        self.request = request
        self.params = request.params
        self.index = index  # which of the request's n samples
        self.age = (request.arrival_time, seq_id)  # older first: scheduling, preemption
        self.token_ids: list[int] = list(request.prompt_token_ids)
        self.num_prompt_tokens = len(request.prompt_token_ids)
        self.token_limit = self.num_prompt_tokens + self.params.max_tokens  # max_tokens reached
        # the tokens that end it once it has min_tokens: stop ids, and EOS unless ignored
        self.stop_ids = frozenset(self.params.stop_token_ids)
        if not self.params.ignore_eos:
            self.stop_ids |= eos_token_ids
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.num_cached_tokens = 0  # of those, how many came from the prefix cache
        self.block_hashes: list[int] = []  # chained hashes of the full blocks, in order
        self.finish_reason: str | None = None
        # when a step first computed it (time.monotonic): its prefill began (traces' phases)
        self.scheduled_at: float | None = None
        # asynchronous scheduling: tokens sampled on the device, not yet on the host (one
        # between steps; two while a step is launched before the previous is read back)
        self.num_pending = 0
        self.pending_index = 0  # the latest one's row among its step's sampled tokens
        # the persistent input batch (`core/input_batch.py`); -1 while not running
        self.row = -1
        self.row_is_new = False  # the runner has not been told about this row yet
        self.synced_blocks = 0  # block-table entries already written to the row
        # structured outputs: this sample's grammar state, advanced by each token on the host
        self.grammar: GrammarMatcher | None = None
        # the scheduler's entry for a plain decode of this sequence (one token, sampled)
        self.decode_entry: ScheduledSeq | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens including one sampled but still on the device."""
        return len(self.token_ids) + self.num_pending

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def compute_target(self) -> int:
        """How many tokens should have K/V before the next sample.

        A request with n > 1 computes its prompt minus the last token once, then forks; each
        fork computes the last prompt token itself (copy-on-write of the shared last block).
        """
        if self.request.pending_forks and self is self.request.seqs[0]:
            return self.num_prompt_tokens - 1
        return self.num_tokens

    def reset_for_recompute(self) -> None:
        """Recompute preemption: drop all KV state; the tokens so far are kept."""
        self.block_table = []
        self.synced_blocks = 0
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.block_hashes = []
        self.status = SequenceStatus.WAITING


@dataclass
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    seqs: list[Sequence] = field(default_factory=list)
    pending_forks: int = 0  # children still to be forked from seqs[0]
    grammar: CompiledGrammar | None = None  # structured outputs: each sample's matcher's
    # the client's view, kept here by the synchronous `LLMEngine` API only
    state: RequestState | None = None

    @property
    def is_finished(self) -> bool:
        return not self.pending_forks and all(s.is_finished for s in self.seqs)


class ScheduledSeq:
    """One sequence's place in a step: how many new tokens it computes and whether a token is
    sampled; the scheduler keeps one per running sequence and reuses it step after step."""

    __slots__ = ("is_prefill", "num_tokens", "sample", "seq")

    def __init__(self, seq: Sequence, num_tokens: int, sample: bool, is_prefill: bool) -> None:
        self.seq = seq
        self.num_tokens = num_tokens  # new tokens computed this step
        self.sample = sample  # this chunk reaches the end, so a token is sampled
        self.is_prefill = is_prefill
