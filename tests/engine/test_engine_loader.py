"""Loader, tokenizer and tiny checkpoints: clear errors, sharded files, chat templates."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from engine_helpers import make_llm
from tiny_checkpoint import write_tiny_checkpoint

from engine.core.llm_engine import LLM
from engine.errors import LoaderError, TokenizerError
from engine.loader import build_model, load_model_args, resolve_model_path
from engine.models.llama import SUPPORTED_ARCHITECTURES
from engine.sampling import SamplingParams
from engine.tokenizer import Tokenizer


def _load(path):
    args = load_model_args(path)
    return build_model(path, args, torch.device("cpu"), torch.float32, "torch", progress=False)


@pytest.fixture
def copy_of(llama_path, tmp_path):
    def make():
        target = tmp_path / "model"
        shutil.copytree(llama_path, target)
        return target

    return make


def test_missing_config_and_weights_are_named(copy_of):
    path = copy_of()
    (path / "model.safetensors").unlink()
    with pytest.raises(LoaderError, match=r"no \*\.safetensors"):
        _load(path)
    (path / "config.json").unlink()
    with pytest.raises(LoaderError, match=r"missing config\.json"):
        _load(path)


def test_missing_shard_is_named(tmp_path):
    path = write_tiny_checkpoint(tmp_path / "sharded", arch="qwen2", shards=2)
    shard = sorted(path.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(LoaderError, match=shard.name):
        _load(path)


def test_unsupported_architecture_lists_supported(copy_of):
    path = copy_of()
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoaderError, match="GPT2LMHeadModel") as err:
        _load(path)
    assert all(name in str(err.value) for name in SUPPORTED_ARCHITECTURES)


def test_shape_mismatch_names_tensor_expected_and_got(copy_of):
    from safetensors.torch import load_file, save_file

    path = copy_of()
    weights = load_file(str(path / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj.weight"
    weights[name] = weights[name][:, :-8].contiguous()
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(LoaderError, match=name) as err:
        _load(path)
    assert "expected shape (64, 128)" in str(err.value) and "got (64, 120)" in str(err.value)


@pytest.mark.parametrize("dtype", ["int32", "float8_e4m3fn"])
def test_integer_or_fp8_tensor_is_a_dtype_error(copy_of, dtype):
    """An fp8 weight without its scale would load as a wrong float: refused by name."""
    from safetensors.torch import load_file, save_file

    path = copy_of()
    weights = load_file(str(path / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    weights[name] = weights[name].to(getattr(torch, dtype))
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(LoaderError, match=rf"{name}.*dtype torch.{dtype} is not a float dtype"):
        _load(path)


@pytest.mark.parametrize(
    "quantization",
    [
        {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
        {"quant_method": "compressed-tensors", "format": "float-quantized"},
    ],
)
def test_a_quantization_config_is_refused_by_name(tmp_path, quantization):
    """A tiny random checkpoint carrying a quantization_config (its weights fp8 with scales, as
    in a real FP8 checkpoint) is refused before any weight loads: never wrong numbers. AWQ and
    GPTQ load (test_awq_gptq.py)."""
    from safetensors.torch import load_file, save_file

    path = write_tiny_checkpoint(
        tmp_path / "quantized", arch="qwen3", quantization_config=quantization
    )
    weights = load_file(str(path / "model.safetensors"))
    for name in [n for n in weights if n.endswith("proj.weight")]:
        weights[name + "_scale_inv"] = weights[name].abs().amax().reshape(1, 1) / 448
        weights[name] = (weights[name] / weights[name + "_scale_inv"]).to(torch.float8_e4m3fn)
    save_file(weights, str(path / "model.safetensors"))
    method = quantization["quant_method"]
    with pytest.raises(LoaderError, match=rf"cannot be served: .*'{method}' is not supported"):
        LLM(path, progress=False, device="cpu")


def test_missing_weight_is_reported(copy_of):
    from safetensors.torch import load_file, save_file

    path = copy_of()
    weights = load_file(str(path / "model.safetensors"))
    del weights["model.layers.0.self_attn.k_proj.weight"]
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(LoaderError, match="qkv_proj"):
        _load(path)


def test_unknown_local_path_and_offline_hub_id(tmp_path, monkeypatch):
    with pytest.raises(LoaderError, match="does not exist"):
        resolve_model_path(str(tmp_path / "nope" / "deeper"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LoaderError, match="could not download"):
        resolve_model_path("switchyard-test/definitely-not-a-model")


@pytest.mark.parametrize("arch", ["qwen2", "mistral"])
def test_other_families_sharded_load_and_match_hf(arch, tmp_path):
    from transformers import AutoModelForCausalLM

    path = write_tiny_checkpoint(tmp_path / arch, arch=arch, shards=2, init_std=0.5)
    assert (path / "model.safetensors.index.json").is_file()
    assert "random" in (path / "README.md").read_text().lower()
    prompt = Tokenizer(path).encode("the quick brown fox")
    llm = make_llm(path)
    ours = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12))[0].token_ids
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    assert ours == ref[0, len(prompt) :].tolist()


def test_tokenizer_special_tokens_and_chat_templates(checkpoints):
    llama = Tokenizer(checkpoints("llama"))
    assert llama.bos_token == "<|begin_of_text|>"
    assert {llama.token_to_id("<|eot_id|>"), llama.token_to_id("<|end_of_text|>")} <= set(
        llama.eos_token_ids
    )
    chat = llama.apply_chat_template([{"role": "user", "content": "hi"}])
    assert chat.startswith("<|begin_of_text|><|start_header_id|>user")
    assert chat.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    ids = llama.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True)
    assert ids.count(llama.bos_token_id) == 1  # no second BOS added when tokenizing
    with pytest.raises(TokenizerError, match="unknown role: wizard"):
        llama.apply_chat_template([{"role": "wizard", "content": "x"}])
    qwen = Tokenizer(checkpoints("qwen3"))
    assert qwen.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    ) == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    text = "Hello wörld 🙂 日本語!"
    assert qwen.decode(qwen.encode(text)) == text


def test_one_rope_table_for_all_layers_sized_to_max_model_len(tmp_path):
    """Per-layer fp32 tables sized to max_position_embeddings cost 0.59 GB on Qwen3-0.6B (28
    layers x 40,960 positions); one shared table sized to max_model_len costs what it needs.
    Tokens still equal HF's: the HF-equality tests run through the shared table."""
    path = write_tiny_checkpoint(
        tmp_path / "long", arch="qwen3", num_hidden_layers=4, max_position_embeddings=32768
    )
    llm = make_llm(path, max_model_len=512)
    model = llm.engine.runner.model
    # the model gathers a step's angles once; layers hold no table of their own
    assert not any(hasattr(layer.self_attn, "rotary_emb") for layer in model.model.layers)
    rope = model.model.rotary_emb
    head_dim = model.args.head_dim
    assert tuple(rope.cos_cache.shape) == tuple(rope.sin_cache.shape) == (512, head_dim // 2)
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())  # deduplicated
    per_layer_before = 4 * 2 * 32768 * (head_dim // 2) * 4  # 4 layers, cos + sin, fp32
    assert buffer_bytes == 2 * 512 * (head_dim // 2) * 4 == per_layer_before // (4 * 64)
    # without max_model_len the table covers the checkpoint's whole context, once
    full = make_llm(path).engine.runner.model.model.rotary_emb
    assert full.cos_cache.shape[0] == 32768
