"""The bundled SmolLM2-135M-Instruct Q4_1 kept quantized against the float32 reference that
multiplies by the *same* dequantized weights (`quantization="none"`).

The C kernel multiplies those weights' exact values (codes times scale plus offset) with
float32 activations, so the two differ only in float rounding: the logprobs of every
generated token agree within `LOGPROB_TOLERANCE`, and greedy decoding gives the same tokens
on the 18 conversations of `test_gguf_smollm2`. The weights take under a quarter of the
float32 memory. About a minute on 2 cores: marked slow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # two engines; a busy box is slow

from test_gguf_smollm2 import CONVERSATIONS, NEW_TOKENS  # noqa: E402

from engine.core.llm_engine import LLM  # noqa: E402
from engine.gguf.bundled import find_bundled_model  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402

LOGPROB_TOLERANCE = 1e-3  # nats: float rounding of a 30-layer model, with room


def _engine(model_file: Path, scratch: Path, **settings: Any) -> Any:
    return LLM(
        model_file,
        progress=False,
        device="cpu",
        download_dir=str(scratch),
        max_num_seqs=len(CONVERSATIONS),
        kv_cache_bytes=64 * 1024 * 1024,
        **settings,
    )


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model_file = find_bundled_model()
    scratch = tmp_path_factory.mktemp("models")
    # the C kernel forced for every row count: the numbers do not depend on a timing
    kept = _engine(model_file, scratch, linear_kernel="native")
    floats = _engine(model_file, scratch, quantization="none", linear_kernel="torch")
    yield kept, floats
    kept.shutdown()
    floats.shutdown()


def test_the_weights_stay_quantized_and_take_a_quarter_of_the_memory(engines: Any) -> None:
    kept, floats = engines
    model = kept.engine.runner.model
    head, embed = model.lm_head, model.model.embed_tokens
    assert head.quantized is embed.quantized is not None  # tied: one quantized copy
    for layer in model.model.layers:
        for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.down_proj):
            assert linear.quantized is not None and linear.weight.numel() == 0
    assert kept.engine.runner.weight_bytes < floats.engine.runner.weight_bytes / 4


def test_greedy_tokens_and_logprobs_equal_the_float_reference(engines: Any) -> None:
    kept, floats = engines
    prompts = [
        kept.tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True)
        for m in CONVERSATIONS
    ]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, logprobs=5)
    ours = kept.generate(prompts, params)
    reference = floats.generate(prompts, params)
    worst = 0.0
    for prompt, mine, theirs in zip(prompts, ours, reference, strict=True):
        assert mine.token_ids == theirs.token_ids, kept.tokenizer.decode(prompt)
        for a, b in zip(mine.outputs[0].logprobs, theirs.outputs[0].logprobs, strict=True):
            worst = max(worst, abs(a.logprob - b.logprob))
            for token in a.top.keys() & b.top.keys():  # the 5th place may tie
                worst = max(worst, abs(a.top[token] - b.top[token]))
    assert worst <= LOGPROB_TOLERANCE
    assert ours[0].text == "The capital of France is Paris."
