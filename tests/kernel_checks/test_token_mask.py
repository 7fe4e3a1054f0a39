"""The masked sampler on the device (CUDA when present, so scripts/gpu_check.sh runs it there).

A structured output's bitmask reaches the sampler as a ``GrammarMask``: the constrained rows
sample only allowed tokens, the other rows get exactly what they get without any mask, and the
mask applied on the device equals the CPU's.
"""

from __future__ import annotations

import torch

from engine.layers.sampler import GrammarMask, Sampler, SamplingBatch
from engine.layers.token_mask import TokenMask

VOCAB = 1000  # not a multiple of 32: the last bitmask word is partly padding


def _batch(rows: int, device: torch.device, grammar: GrammarMask | None) -> SamplingBatch:
    return SamplingBatch(
        temperatures=torch.ones(rows, device=device),
        greedy=torch.ones(rows, dtype=torch.bool, device=device),
        all_greedy=True,
        top_k=None,
        top_p=None,
        min_p=None,
        count_penalties=None,
        repetition=None,
        banned=None,
        seeded=[],
        default_generator=torch.Generator(device).manual_seed(0),
        num_logprobs=3,
        grammar=grammar,
    )


def _bitmask(allowed: list[list[int]]) -> torch.Tensor:
    words = torch.zeros(len(allowed), -(-VOCAB // 32), dtype=torch.int64)
    for row, tokens in enumerate(allowed):
        for token in tokens:
            words[row, token // 32] |= 1 << (token % 32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def test_masked_rows_sample_only_allowed_tokens_and_others_are_untouched(device):
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(6, VOCAB, generator=generator).to(device)
    allowed = [[5, 999], [40, 41, 42], [7]]
    rows = torch.tensor([1, 3, 4], device=device)
    grammar = GrammarMask(rows, _bitmask(allowed).to(device))
    sampler = Sampler()
    free = sampler(logits.clone(), _batch(6, device, None))
    masked = sampler(logits.clone(), _batch(6, device, grammar))
    for row, tokens in zip(rows.tolist(), allowed, strict=True):
        assert masked.token_ids[row].item() in tokens
        # logprobs of the constrained distribution: only the allowed tokens, mass one
        finite = torch.isfinite(masked.top_logprobs[row])
        assert set(masked.top_ids[row][finite].tolist()) == set(tokens)
        mass = masked.top_logprobs[row][finite].exp().sum()
        assert torch.isclose(mass, torch.tensor(1.0, device=device), atol=1e-5)
    for row in (0, 2, 5):
        assert masked.token_ids[row] == free.token_ids[row]
        assert torch.equal(masked.top_logprobs[row], free.top_logprobs[row])


def test_the_mask_on_the_device_equals_the_cpu_mask(device):
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(8, VOCAB, generator=generator)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (8, -(-VOCAB // 32)), dtype=torch.int32)
    rows = torch.arange(8)
    on_cpu = logits.clone()
    TokenMask().apply(on_cpu, rows, bitmask)
    on_device = logits.to(device)
    TokenMask().apply(on_device, rows.to(device), bitmask.to(device))
    assert torch.equal(on_device.cpu(), on_cpu)
    assert torch.isinf(on_cpu).any() and torch.isfinite(on_cpu).any()
