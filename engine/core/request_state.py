"""The client's view of one request: its samples' detokenizers, streamed text and held-back
suffixes. `RequestState` is created with the request (`LLMEngine.add_request` keeps it on the
request for the synchronous API; `AsyncEngine` keeps it in its stream) and advanced by
`output_processor.process_step`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field

from engine.core.detokenizer import Detokenizer, make_detokenizer
from engine.sampling import SamplingParams, TokenLogprobs
from engine.tokenizer import Tokenizer


@dataclass(slots=True)
class StreamOutput:
    """What one sample produced since its previous output (text never splits a character)."""

    request_id: str
    index: int  # which of the n samples
    text: str  # new text
    token_ids: list[int]  # new token ids
    logprobs: list[TokenLogprobs] | None
    finish_reason: str | None  # set on the last output of this index
    num_prompt_tokens: int
    num_output_tokens: int  # cumulative for this index
    finished: bool  # the whole request is done (set on its very last output)
    step_time: float | None = None  # when the step's tokens reached the host (time.monotonic)
    scheduled_at: float | None = None  # on a sample's first output: when its prefill began


def held_back(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that could still grow into a stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


@dataclass(slots=True, eq=False)
class SampleState:
    """One of a request's n samples, as the client sees it."""

    detokenizer: Detokenizer
    pieces: list[str] = field(default_factory=list)  # the text streamed so far
    held: str = ""  # text held back: it may still become a stop string
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    last_time: float | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)


@dataclass(eq=False)
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    tokenizer: InitVar[Tokenizer]  # only to make each sample's detokenizer
    arrival_time: float = field(default_factory=time.monotonic)
    samples: list[SampleState] = field(init=False)
    num_unfinished: int = field(init=False)
    # where a step's outputs go (AsyncEngine: the stream's outbox); None: kept by the caller
    sink: Callable[[list[StreamOutput]], None] | None = field(default=None, init=False)

    def __post_init__(self, tokenizer: Tokenizer) -> None:
        self.samples = [
            SampleState(make_detokenizer(tokenizer, self.prompt_token_ids))
            for _ in range(self.params.n)
        ]
        self.num_unfinished = self.params.n

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def finished(self) -> bool:
        return not self.num_unfinished
