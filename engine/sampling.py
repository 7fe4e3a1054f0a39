"""Per-request sampling settings (OpenAI/vLLM meanings), validated with clear messages."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.errors import SamplingParamsError
from engine.structured.spec import StructuredOutput


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0) disables
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    max_tokens: int = 16
    min_tokens: int = 0
    logprobs: int | None = None  # how many top logprobs per generated token
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # HF/vLLM: every prompt or output token's logit, / or *
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False  # keep the matched stop string in the text
    # OpenAI's logit_bias: token id -> a value in [-100, 100] added to its logit
    logit_bias: dict[int, float] = field(default_factory=dict)
    # the output must match this (a grammar's token mask, `engine/structured/`); None: free
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        if self.top_k == 0:
            self.top_k = -1
        self.logit_bias = dict(self.logit_bias or {})
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_count_penalties(self) -> bool:
        """Presence or frequency penalty: the sampler needs the output's token counts."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def has_repetition_penalty(self) -> bool:
        return self.repetition_penalty != 1.0

    @property
    def has_logit_bias(self) -> bool:
        return any(self.logit_bias.values())

    @property
    def has_penalties(self) -> bool:
        return self.has_count_penalties or self.has_repetition_penalty

    def validate(self) -> None:
        def bad(name: str, rule: str) -> SamplingParamsError:
            return SamplingParamsError(f"{name} must be {rule}, got {getattr(self, name)!r}")

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", "an integer >= 1")
        if self.temperature < 0.0:
            raise bad("temperature", ">= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "in (0, 1]")
        if not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k != -1):
            raise bad("top_k", "-1 (disabled) or >= 1")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "in [0, 1]")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise bad("max_tokens", "an integer >= 1")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise bad("min_tokens", "an integer in [0, max_tokens]")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise bad("logprobs", "in [0, 20]")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", "in [-2, 2]")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", "in [-2, 2]")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise bad("repetition_penalty", "in (0, 2]")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "a list of non-empty strings")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "a list of non-negative token ids")
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad("seed", "an integer")
        for token, bias in self.logit_bias.items():
            if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                raise bad("logit_bias", "a map of non-negative token ids to numbers")
            if isinstance(bias, bool) or not isinstance(bias, int | float):
                raise bad("logit_bias", "a map of token ids to numbers in [-100, 100]")
            if not -100.0 <= bias <= 100.0:
                raise bad("logit_bias", "a map of token ids to numbers in [-100, 100]")
        if self.structured is not None:
            if not isinstance(self.structured, StructuredOutput):
                raise bad("structured", "a StructuredOutput")
            if self.min_tokens:
                # banning the end of the output could leave the grammar nothing to allow
                raise bad("min_tokens", "0 with a structured output constraint")


@dataclass
class TokenLogprobs:
    """The sampled token's logprob and the top-k alternatives: the model's distribution before
    temperature, penalties and logit_bias; under a structured output constraint, after the
    grammar's mask (disallowed tokens removed, the rest renormalised), as vLLM reports it."""

    token_id: int
    logprob: float
    top: dict[int, float]
