"""GGUF checkpoints: dequantizers bit-exact against the `gguf` package, tiny GGUF files (every
legacy quant type, llama/qwen2/qwen3) token-equal to HF transformers loading the same file, the
once-per-file HF-format view, and clear refusals of what the engine would compute wrongly."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402
from gguf.quants import quantize as gguf_quantize  # noqa: E402
from tiny_gguf import write_tiny_gguf  # noqa: E402

from engine.core.llm_engine import LLM  # noqa: E402
from engine.errors import LoaderError, TokenizerError  # noqa: E402
from engine.gguf.convert import STAMP_FILE, is_prepared, prepare_gguf, view_dir  # noqa: E402
from engine.gguf.dequant import BLOCK_LAYOUT, NATIVE_TYPES, dequantize  # noqa: E402
from engine.gguf.tokenizer import build_tokenizer_json  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402

TEXTS = (
    "The quick brown fox jumps over the lazy dog",
    "Numbers: 0 1 2 3 42 and 1,234,567.",
    "Café, naïve, façade 日本語のテキスト 🙂",
    "How are you today? I am fine, thank you.",
)
QUANTIZABLE = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "BF16")  # gguf-py can write these


def _random_blocks(type_name: str, rows: int, blocks_per_row: int, seed: int) -> np.ndarray:
    """Random block bytes whose fp16 scale fields are finite (any other byte is valid)."""
    rng = np.random.default_rng(seed)
    block_bytes, _ = BLOCK_LAYOUT[type_name]
    raw = rng.integers(0, 256, size=(rows * blocks_per_row, block_bytes), dtype=np.uint8)
    scale_offsets = {
        "Q2_K": (80, 82),
        "Q3_K": (108,),
        "Q4_K": (0, 2),
        "Q5_K": (0, 2),
        "Q6_K": (208,),
    }[type_name]
    scales = rng.uniform(-0.05, 0.05, size=(raw.shape[0], len(scale_offsets))).astype(np.float16)
    for i, offset in enumerate(scale_offsets):
        raw[:, offset : offset + 2] = scales[:, i : i + 1].view(np.uint8)
    return raw.reshape(rows, blocks_per_row * block_bytes)


@pytest.mark.parametrize("type_name", NATIVE_TYPES)
def test_every_native_dequantizer_equals_the_gguf_package_bit_for_bit(type_name: str) -> None:
    rows, cols = 6, 512
    qtype = GGMLQuantizationType[type_name]
    if type_name in ("F32", "F16"):
        values = np.random.default_rng(1).normal(size=(rows, cols))
        raw = values.astype(np.float32 if type_name == "F32" else np.float16)
    elif type_name in QUANTIZABLE:
        values = np.random.default_rng(1).normal(size=(rows, cols)).astype(np.float32)
        raw = gguf_quantize(values, qtype)
    else:
        raw = _random_blocks(type_name, rows, cols // 256, seed=2)
    expected = torch.from_numpy(gguf_dequantize(raw, qtype).astype(np.float32))
    ours = dequantize(
        torch.from_numpy(np.ascontiguousarray(raw)).view(torch.uint8), type_name, (rows, cols)
    )
    assert ours.dtype == torch.float32 and ours.shape == (rows, cols)
    assert torch.equal(ours, expected)


def test_a_type_only_the_gguf_package_knows_goes_through_it() -> None:
    values = np.random.default_rng(3).normal(size=(4, 256)).astype(np.float32)
    raw = gguf_quantize(values, GGMLQuantizationType.Q8_0)  # bytes of a Q8_0 tensor
    expected = gguf_dequantize(raw, GGMLQuantizationType.Q8_0)
    # IQ4_NL has Q4_0's size but different values: a lookup table this module lacks
    iq_raw = raw[:, : raw.shape[1] // 34 * 18].copy()
    iq = dequantize(torch.from_numpy(iq_raw), "IQ4_NL", (4, 256))
    assert torch.equal(iq, torch.from_numpy(gguf_dequantize(iq_raw, GGMLQuantizationType.IQ4_NL)))
    assert not torch.equal(iq, torch.from_numpy(expected))
    with pytest.raises(LoaderError, match="cannot dequantize GGML type NOPE"):
        dequantize(torch.zeros(8, dtype=torch.uint8), "NOPE", (8,))


@pytest.fixture(scope="module")
def hf_gguf_reference(tmp_path_factory: pytest.TempPathFactory):
    made: dict[str, tuple[Path, list[list[int]], list[list[int]]]] = {}

    def get(arch: str) -> tuple[Path, list[list[int]], list[list[int]]]:
        if arch not in made:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            overrides = {"head_dim": 128} if arch == "qwen3" else {}  # HF's default for qwen3
            root = tmp_path_factory.mktemp(f"gguf-{arch}")
            path = write_tiny_gguf(root / f"tiny-{arch}.gguf", arch=arch, seed=3, **overrides)
            tokenizer = AutoTokenizer.from_pretrained(root, gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(
                root, gguf_file=path.name, dtype=torch.float32
            ).eval()
            prompts = [tokenizer(text)["input_ids"] for text in TEXTS]
            outputs = []
            with torch.inference_mode():
                for prompt in prompts:
                    ids = torch.tensor([prompt])
                    out = model.generate(
                        ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False
                    )
                    outputs.append(out[0, len(prompt) :].tolist())
            made[arch] = (path, prompts, outputs)
        return made[arch]

    return get


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_gguf_files_generate_what_hf_generates(
    arch: str, hf_gguf_reference, tmp_path: Path
) -> None:
    path, prompts, expected = hf_gguf_reference(arch)
    # the float32 path (HF dequantizes too); kept quantized: test_gguf_planes.py
    llm = LLM(path, progress=False, device="cpu", download_dir=str(tmp_path), quantization="none")
    assert [llm.tokenizer.encode(t) for t in TEXTS] == prompts  # the same tokenizer as HF's
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16))
    assert [o.token_ids for o in outputs] == expected


def test_the_view_is_made_once_and_remade_when_the_file_changes(tmp_path: Path) -> None:
    source = write_tiny_gguf(tmp_path / "m.gguf", arch="qwen2", types=("Q8_0",))
    view = prepare_gguf(source, tmp_path / "cache")
    assert (view / "model.gguf").resolve() == source.resolve()
    names = {p.name for p in view.iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "gguf_tensors.json"} <= names
    assert not list(view.glob("*.safetensors"))  # weights stay in the GGUF, quantized
    config = json.loads((view / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["attention_bias"] is True
    stamp = (view / STAMP_FILE).stat().st_mtime_ns
    assert prepare_gguf(source, tmp_path / "cache") == view
    assert (view / STAMP_FILE).stat().st_mtime_ns == stamp  # reused, not rewritten
    os.utime(source, ns=(stamp + 10**9, stamp + 10**9))
    prepare_gguf(source, tmp_path / "cache")
    assert json.loads((view / STAMP_FILE).read_text())["mtime_ns"] == stamp + 10**9
    source.unlink()
    with pytest.raises(LoaderError, match="no longer exists"):
        LLM(view, progress=False, device="cpu")


def test_a_conversion_with_progress_shows_its_steps_and_is_not_redone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_tiny_gguf(tmp_path / "m.gguf", arch="llama", types=("Q8_0",))
    cache = tmp_path / "cache"
    assert not is_prepared(source, cache)
    view = prepare_gguf(source, cache, progress=True)
    assert view == view_dir(source, cache) and is_prepared(source, cache)
    bar = capsys.readouterr().err
    assert "Converting m.gguf" in bar and "4/4" in bar and "written" in bar
    prepare_gguf(source, cache, progress=True)
    assert capsys.readouterr().err == ""  # nothing to do, nothing said


def test_what_the_engine_would_compute_wrongly_is_refused(tmp_path: Path) -> None:
    def rewrite(name: str, edit) -> Path:
        reader = gguf.GGUFReader(str(write_tiny_gguf(tmp_path / "src.gguf", types=("F32",))))
        out = tmp_path / name
        writer = gguf.GGUFWriter(str(out), "llama")
        fields = {
            k: f.contents()
            for k, f in reader.fields.items()
            if not k.startswith("GGUF.") and k != "general.architecture"
        }
        tensors = {t.name: np.array(t.data) for t in reader.tensors}
        arch = edit(fields, tensors) or "llama"
        writer = gguf.GGUFWriter(str(out), arch)
        for key, value in fields.items():
            if isinstance(value, str):
                writer.add_string(key, value)
            elif isinstance(value, bool):
                writer.add_bool(key, value)
            elif isinstance(value, float):
                writer.add_float32(key, value)
            elif isinstance(value, int):
                writer.add_uint32(key, value)
            else:
                writer.add_array(key, value)
        for tname, data in tensors.items():
            writer.add_tensor(tname, data)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return out

    def gemma(fields, tensors):
        for key in list(fields):
            if key.startswith("llama."):
                fields[key.replace("llama.", "gemma.")] = fields.pop(key)
        return "gemma"

    cases = {
        "gemma": (gemma, LoaderError, "GGUF architecture 'gemma' is not supported"),
        "rope-freqs": (
            lambda f, t: t.update({"rope_freqs.weight": np.ones(8, np.float32)}),
            LoaderError,
            "rope_freqs",
        ),
        "yarn": (
            lambda f, t: f.update({"llama.rope.scaling.type": "yarn"}),
            LoaderError,
            "RoPE scaling 'yarn' is not supported",
        ),
        "pre": (
            lambda f, t: f.update({"tokenizer.ggml.pre": "jais"}),
            TokenizerError,
            "pre-tokenizer 'jais' is not supported",
        ),
        "spm": (
            lambda f, t: f.update({"tokenizer.ggml.model": "llama"}),
            TokenizerError,
            "tokenizer model 'llama' is not supported",
        ),
    }
    for name, (edit, error, message) in cases.items():
        with pytest.raises(error, match=message):
            prepare_gguf(rewrite(f"{name}.gguf", edit), tmp_path / "cache")
    with pytest.raises(LoaderError, match="not a readable GGUF file"):
        (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
        prepare_gguf(tmp_path / "junk.gguf", tmp_path / "cache")
    with pytest.raises(TokenizerError, match=r"no tokenizer\.ggml\.tokens"):
        build_tokenizer_json({"tokenizer.ggml.model": "gpt2"})
