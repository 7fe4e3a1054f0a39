"""A request and its sequences: token ids, KV bookkeeping, and the text emitted so far."""

from __future__ import annotations

import enum
import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from engine.sampling import SamplingParams
from engine.tokenizer import IncrementalDetokenizer


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class TokenLogprobs:
    """The sampled token's logprob and the top-k alternatives, raw model distribution."""

    token_id: int
    logprob: float
    top: dict[int, float]


class Sequence:
    def __init__(
        self,
        seq_id: int,
        request: Request,
        index: int,
        detokenizer: IncrementalDetokenizer | None,
        generator: torch.Generator | None,
    ) -> None:
        self.seq_id = seq_id
        self.request = request
        self.index = index  # which of the request's n samples
        self.token_ids: list[int] = list(request.prompt_token_ids)
        self.num_prompt_tokens = len(request.prompt_token_ids)
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.num_cached_tokens = 0  # of those, how many came from the prefix cache
        self.block_hashes: list[int] = []  # chained hashes of the full blocks, in order
        self.generator = generator
        self.detokenizer = detokenizer
        self.output_text = ""
        self.emitted_text_len = 0
        self.emitted_token_count = 0
        self.emitted_logprob_count = 0
        self.logprobs: list[TokenLogprobs] = []
        self.finish_reason: str | None = None
        self.finish_emitted = False
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.output_counts: Counter[int] = Counter()

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

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

    @property
    def is_finished(self) -> bool:
        return not self.pending_forks and all(s.is_finished for s in self.seqs)
