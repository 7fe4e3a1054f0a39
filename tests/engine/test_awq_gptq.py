"""AWQ and GPTQ checkpoints: small random-weight Llama checkpoints written in each method's
layout (int32-packed codes and zeros, float16 scales, `quantization_config`) load, kept
quantized on the CPU or dequantized, and generate the greedy tokens of a float checkpoint
holding the same dequantized weights; what the kernels cannot run is refused with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from engine_helpers import make_prompts  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from tiny_checkpoint import write_tiny_checkpoint  # noqa: E402

from engine.core.llm_engine import LLM  # noqa: E402
from engine.errors import LoaderError  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402
from engine.tokenizer import Tokenizer  # noqa: E402

GROUP = 32
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a word holds column AWQ_ORDER[i]


def _quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit per group of inputs: codes [out, in], zeros and fp16 scales
    [out, in/GROUP]; zeros kept in 1..15 (GPTQ v1 stores zero - 1)."""
    groups = weight.view(weight.shape[0], -1, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    scales = ((high - low) / 15).clamp(min=1e-6).half()
    zeros = torch.round(-low / scales.float()).clamp(1, 15)
    codes = torch.round(groups / scales.float().unsqueeze(-1)) + zeros.unsqueeze(-1)
    return codes.clamp(0, 15).view_as(weight).to(torch.int64), zeros.to(torch.int64), scales


def _words(fields: torch.Tensor) -> torch.Tensor:
    """[..., 8] nibbles -> int32 words, nibble i at bits 4i."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    return ((fields << shifts).sum(-1) & 0xFFFFFFFF).to(torch.int32)


def _pack_columns(values: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    rows, cols = values.shape
    grouped = values.view(rows, cols // 8, 8)[:, :, list(order)]
    return _words(grouped)


def write_quantized_checkpoint(root: Path, method: str, **config: object) -> tuple[Path, Path]:
    """(the quantized checkpoint, a float one with the same dequantized weights)."""
    source = write_tiny_checkpoint(root / "float-source", arch="llama", seed=4, init_std=0.1)
    weights = {}
    for file in source.glob("*.safetensors"):
        weights.update(load_file(str(file)))
    packed, dense = {}, {}
    for name, tensor in weights.items():
        layer, _, part = name.rpartition(".")
        if part != "weight" or layer.rpartition(".")[2] not in LINEARS:
            packed[name] = dense[name] = tensor
            continue
        codes, zeros, scales = _quantize(tensor.float())
        dequantized = (codes - zeros.repeat_interleave(GROUP, 1)).float()
        dense[name] = dequantized * scales.float().repeat_interleave(GROUP, 1)
        if method == "awq":
            packed[f"{layer}.qweight"] = _pack_columns(codes.t().contiguous(), AWQ_ORDER)
            packed[f"{layer}.qzeros"] = _pack_columns(zeros.t().contiguous(), AWQ_ORDER)
        else:
            words = codes.t().contiguous().view(-1, 8, codes.shape[0]).transpose(1, 2)
            packed[f"{layer}.qweight"] = _words(words)
            packed[f"{layer}.qzeros"] = _pack_columns((zeros - 1).t().contiguous(), tuple(range(8)))
            packed[f"{layer}.g_idx"] = torch.arange(codes.shape[1], dtype=torch.int32) // GROUP
        packed[f"{layer}.scales"] = scales.t().contiguous()
    made = []
    for kind, tensors in (("quantized", packed), ("reference", dense)):
        target = root / kind
        target.mkdir()
        for item in source.iterdir():
            if item.suffix != ".safetensors":
                (target / item.name).write_bytes(item.read_bytes())
        save_file(tensors, str(target / "model.safetensors"))
        made.append(target)
    quant_config: dict[str, object] = {"quant_method": method, "bits": 4, "group_size": GROUP}
    if method == "awq":
        quant_config.update(version="gemm", zero_point=True)
    quant_config.update(config)
    config_file = made[0] / "config.json"
    hf_config = json.loads(config_file.read_text())
    hf_config["quantization_config"] = quant_config
    config_file.write_text(json.dumps(hf_config))
    return made[0], made[1]


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_a_quantized_checkpoint_generates_what_its_dequantized_weights_do(
    method: str, tmp_path: Path
) -> None:
    quantized, reference = write_quantized_checkpoint(tmp_path, method)
    prompts = make_prompts(Tokenizer(reference))
    params = SamplingParams(temperature=0.0, max_tokens=12)
    expected = [o.token_ids for o in LLM(reference, progress=False, device="cpu").generate(
        prompts, params
    )]  # fmt: skip
    kept = LLM(quantized, progress=False, device="cpu", linear_kernel="native")
    down = kept.engine.runner.model.model.layers[0].mlp.down_proj
    assert down.quantized is not None and down.quantized.source_format == method.upper()
    assert down.quantized.group_size == GROUP and down.weight.numel() == 0
    assert [o.token_ids for o in kept.generate(prompts, params)] == expected
    floats = LLM(quantized, progress=False, device="cpu", quantization="none")
    assert floats.engine.runner.model.model.layers[0].mlp.down_proj.quantized is None
    assert [o.token_ids for o in floats.generate(prompts, params)] == expected


@pytest.mark.parametrize(
    ("method", "config", "reason"),
    [
        ("gptq", {"desc_act": True}, "desc_act"),
        ("gptq", {"bits": 3}, "3-bit"),
        ("awq", {"version": "gemv"}, "GEMM layout"),
    ],
)
def test_what_the_kernels_cannot_run_is_refused_with_the_reason(
    method: str, config: dict, reason: str, tmp_path: Path
) -> None:
    quantized, _ = write_quantized_checkpoint(tmp_path, method, **config)
    with pytest.raises(LoaderError, match=reason):
        LLM(quantized, progress=False, device="cpu")


def test_an_unknown_method_is_refused_by_name(tmp_path: Path) -> None:
    path = write_tiny_checkpoint(tmp_path / "fp8", arch="llama", seed=1)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8"}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoaderError, match="'fp8' is not supported"):
        LLM(path, progress=False, device="cpu")
