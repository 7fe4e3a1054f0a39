"""Batched sampling on the device: penalties, temperature, top-k/top-p/min-p, per-row seeds.

A structured output's token mask (`layers/token_mask.py`) comes first, for the constrained
rows only; the logprobs are taken after it (the constrained distribution), then OpenAI's
logit_bias is added. Of the penalties, the repetition penalty (HF's and vLLM's meaning: a
seen token's logit is divided by the penalty when positive, multiplied when negative; seen =
in the prompt or the output) comes first, then the presence and frequency penalties
(OpenAI's, over the output only).

Random draws use the exponential-race trick (argmax of p / Exp(1) noise is a sample from p),
with a row's own generator when the request has a seed, so a seeded request samples the same
tokens whatever else shares its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.layers.token_mask import TokenMask


@dataclass
class CountPenalties:
    """OpenAI's presence and frequency penalties, over the tokens generated so far."""

    presence: torch.Tensor  # [S] float32
    frequency: torch.Tensor  # [S] float32
    counts: torch.Tensor  # [rows, V] (int or float): tokens generated so far, per state row
    rows: torch.Tensor | None  # [S] int64: the batch's rows of `counts`; None: row i is i


@dataclass
class RepetitionPenalty:
    """HF's repetition penalty, over the tokens seen so far (in the prompt or the output)."""

    penalty: torch.Tensor  # [S] float32
    seen: torch.Tensor  # [rows, V] bool, per state row
    rows: torch.Tensor | None  # [S] int64: the batch's rows of `seen`; None: row i is i


@dataclass
class GrammarMask:
    """The constrained rows' allowed tokens this step (structured outputs)."""

    rows: torch.Tensor  # [k] int64: positions among the sampled rows
    bitmask: torch.Tensor  # [k, ceil(V / 32)] int32, one bit per token (1 = allowed)


@dataclass
class LogitBias:
    """OpenAI's logit_bias of the rows that have one, as (row, token, bias) triples."""

    rows: torch.Tensor  # [m] int64: positions among the sampled rows
    token_ids: torch.Tensor  # [m] int64
    values: torch.Tensor  # [m] float32


@dataclass
class SamplingBatch:
    """Per-row sampling settings for the rows being sampled this step, already on device."""

    temperatures: torch.Tensor  # [S] float32; greedy rows hold 1.0
    greedy: torch.Tensor  # [S] bool
    all_greedy: bool
    top_k: torch.Tensor | None  # [S] int64, vocab size where disabled
    top_p: torch.Tensor | None  # [S] float32
    min_p: torch.Tensor | None  # [S] float32
    count_penalties: CountPenalties | None
    repetition: RepetitionPenalty | None
    banned: torch.Tensor | None  # [S, V] bool (EOS/stop ids before min_tokens)
    seeded: list[tuple[int, torch.Generator]]  # (row, its own generator): seeded requests
    default_generator: torch.Generator
    num_logprobs: int  # top logprobs to return (0: none)
    grammar: GrammarMask | None = None
    logit_bias: LogitBias | None = None


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # [S] int64
    logprobs: torch.Tensor | None  # [S] sampled token's logprob
    top_ids: torch.Tensor | None  # [S, k]
    top_logprobs: torch.Tensor | None  # [S, k]


class Sampler(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.token_mask = TokenMask()

    def forward(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        logits = logits.float()
        if batch.grammar is not None:
            self.token_mask.apply(logits, batch.grammar.rows, batch.grammar.bitmask)
        raw_logprobs = torch.log_softmax(logits, dim=-1) if batch.num_logprobs else None
        if batch.logit_bias is not None:
            bias = batch.logit_bias
            logits = logits.index_put((bias.rows, bias.token_ids), bias.values, accumulate=True)
        if batch.repetition is not None:
            seen = self._rows(batch.repetition.seen, batch.repetition.rows)
            penalty = batch.repetition.penalty[:, None]
            penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
            logits = torch.where(seen, penalised, logits)
        if batch.count_penalties is not None:
            counted = batch.count_penalties
            counts = self._rows(counted.counts, counted.rows)
            logits = logits - counted.presence[:, None] * (counts > 0)
            logits = logits - counted.frequency[:, None] * counts
        if batch.banned is not None:
            logits = logits.masked_fill(batch.banned, float("-inf"))
        tokens = logits.argmax(dim=-1)
        if not batch.all_greedy:
            sampled = self._sample(logits / batch.temperatures[:, None], batch)
            tokens = torch.where(batch.greedy, tokens, sampled)
        if raw_logprobs is None:
            return SamplerOutput(tokens, None, None, None)
        top_logprobs, top_ids = raw_logprobs.topk(batch.num_logprobs, dim=-1)
        chosen = raw_logprobs.gather(1, tokens[:, None]).squeeze(1)
        return SamplerOutput(tokens, chosen, top_ids, top_logprobs)

    @staticmethod
    def _rows(table: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        return table if rows is None else table.index_select(0, rows)

    def _sample(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        if batch.top_k is not None or batch.top_p is not None:
            logits = _top_k_top_p(logits, batch.top_k, batch.top_p)
        probs = torch.softmax(logits, dim=-1)
        if batch.min_p is not None:
            threshold = batch.min_p[:, None] * probs.max(dim=-1, keepdim=True).values
            probs = probs.masked_fill(probs < threshold, 0.0)
        noise = torch.empty_like(probs).exponential_(generator=batch.default_generator)
        for row, generator in batch.seeded:  # a seeded request draws from its own stream
            noise[row].exponential_(generator=generator)
        return (probs / noise).argmax(dim=-1)


def _top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    if top_k is not None:
        ranks = torch.arange(logits.shape[-1], device=logits.device)[None, :]
        sorted_logits = sorted_logits.masked_fill(ranks >= top_k[:, None], float("-inf"))
    if top_p is not None:
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        # the top token always survives: its mass_before is 0 < top_p
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_p[:, None], float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
