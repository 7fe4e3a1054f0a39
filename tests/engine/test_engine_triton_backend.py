"""The whole engine on the Triton kernels (the interpreter on CPU) gives HF's greedy tokens."""

from __future__ import annotations

import os

import torch

# `@triton.jit` reads this when the kernel modules are first imported (lazily, at first use).
# On a GPU the kernels run natively.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from engine_helpers import assert_all_blocks_free, make_llm

from engine.sampling import SamplingParams

pytest.importorskip("triton")

NEW_TOKENS = 6


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_triton_backend_matches_hf(arch, checkpoints, hf_reference):
    prompts, expected = hf_reference(arch)
    picks = [0, 1, 5, 10]  # short and long prompts, with and without the shared prefix
    llm = make_llm(
        checkpoints(arch),
        attention_backend="triton",
        max_num_batched_tokens=32,  # chunked prefill mixed with decodes
        enable_prefix_caching=True,
    )
    assert llm.engine.runner.backend == "triton"
    outs = llm.generate(
        [prompts[i] for i in picks], SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
    )
    assert [o.token_ids for o in outs] == [expected[i][:NEW_TOKENS] for i in picks]
    assert_all_blocks_free(llm)
