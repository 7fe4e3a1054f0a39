"""The client's view of one request: its samples' detokenizers, streamed text and held-back
suffixes. `RequestState` is created with the request (`LLMEngine.add_request` keeps it on the
request for the synchronous API; `AsyncEngine` keeps it in its stream) and advanced by
`output_processor.process_step`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

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


class SampleState:
    """One of a request's n samples, as the client sees it."""

    __slots__ = (
        "detokenizer",
        "finish_reason",
        "held",
        "last_time",
        "logprobs",
        "pieces",
        "token_ids",
    )

    def __init__(self, detokenizer: Detokenizer) -> None:
        self.detokenizer = detokenizer
        self.pieces: list[str] = []  # the text streamed so far
        self.held = ""  # text held back: it may still become a stop string
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprobs] = []
        self.finish_reason: str | None = None
        self.last_time: float | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class RequestState:
    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        tokenizer: Tokenizer,
        arrival_time: float | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.samples = [
            SampleState(make_detokenizer(tokenizer, prompt_token_ids)) for _ in range(params.n)
        ]
        self.num_unfinished = params.n
        # where a step's outputs go (AsyncEngine: the stream's outbox); None: kept by the caller
        self.sink: Callable[[list[StreamOutput]], None] | None = None

    @property
    def finished(self) -> bool:
        return not self.num_unfinished
