"""GGUF blocks kept quantized (`engine.gguf.planes`): every type's codes, scales and offsets
dequantize to exactly the floats the dequantizers give (which equal the `gguf` package's),
and a tiny GGUF file of each kept type generates the same greedy tokens kept quantized as
dequantized at load, with its memory smaller."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import quantize as gguf_quantize  # noqa: E402
from test_gguf_loading import QUANTIZABLE, TEXTS, _random_blocks  # noqa: E402
from tiny_gguf import write_tiny_gguf  # noqa: E402

from engine.core.llm_engine import LLM  # noqa: E402
from engine.gguf.dequant import dequantize  # noqa: E402
from engine.gguf.planes import KEPT_TYPES, quantized_weight  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402


@pytest.mark.parametrize("type_name", KEPT_TYPES)
def test_kept_blocks_dequantize_to_the_same_floats_bit_for_bit(type_name: str) -> None:
    rows, cols = 6, 512
    if type_name in QUANTIZABLE:
        values = np.random.default_rng(1).normal(size=(rows, cols)).astype(np.float32)
        values[0, :32] = 0.0  # an all-zero block (scale 0)
        raw = gguf_quantize(values, GGMLQuantizationType[type_name])
    else:
        raw = _random_blocks(type_name, rows, cols // 256, seed=2)
    data = torch.from_numpy(np.ascontiguousarray(raw)).view(torch.uint8)
    kept = quantized_weight(data, type_name, (rows, cols))
    assert kept.shape == (rows, cols) and kept.bits == (4 if type_name[:2] == "Q4" else 8)
    assert torch.equal(kept.dequantize(), dequantize(data, type_name, (rows, cols)))
    assert kept.nbytes < rows * cols * 4


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0", "Q5_1"])
def test_a_kept_gguf_generates_what_its_dequantized_load_generates(
    type_name: str, tmp_path: Path
) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", arch="llama", seed=3, types=(type_name,))
    kept = LLM(path, progress=False, device="cpu", download_dir=str(tmp_path / "a"))
    floats = LLM(
        path, progress=False, device="cpu", download_dir=str(tmp_path / "b"), quantization="none"
    )
    layer = kept.engine.runner.model.model.layers[0].mlp.down_proj
    assert layer.quantized is not None and layer.weight.numel() == 0
    assert floats.engine.runner.model.model.layers[0].mlp.down_proj.quantized is None
    assert kept.engine.runner.weight_bytes < floats.engine.runner.weight_bytes
    prompts = [kept.tokenizer.encode(text) for text in TEXTS]
    params = SamplingParams(temperature=0.0, max_tokens=16)
    assert [o.token_ids for o in kept.generate(prompts, params)] == [
        o.token_ids for o in floats.generate(prompts, params)
    ]
