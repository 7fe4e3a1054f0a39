"""Write small random-weight GGUF files the way llama.cpp's converter lays them out.

`write_tiny_gguf(path, arch, types)` writes a tiny checkpoint (`tests/support/tiny_checkpoint.py`)
as one `.gguf` file: llama.cpp's metadata keys and tensor names, the Llama q/k rows permuted
for its rotary layout, the byte-level BPE vocabulary with merges, token types, special ids and
the chat template, and each 2-D weight quantized to the GGML type `types` picks for it (the
`gguf` package quantizes). HF `transformers` loads the same file, which is what the GGUF
equality tests compare against. Weights are random: for tests only.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tiny_checkpoint import write_tiny_checkpoint

DEFAULT_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16", "BF16", "F32")
_ARCH_NAMES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
# GGUF model metadata (the GGUFWriter method that writes it) <- the HF config key it comes from
_MODEL_FIELDS = {
    "add_context_length": "max_position_embeddings",
    "add_embedding_length": "hidden_size",
    "add_block_count": "num_hidden_layers",
    "add_feed_forward_length": "intermediate_size",
    "add_head_count": "num_attention_heads",
    "add_head_count_kv": "num_key_value_heads",
    "add_rope_freq_base": "rope_theta",
    "add_layer_norm_rms_eps": "rms_norm_eps",
    "add_rope_dimension_count": "head_dim",
    "add_key_length": "head_dim",
    "add_value_length": "head_dim",
    "add_vocab_size": "vocab_size",
}
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _gguf_name(name: str) -> str:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = name.split(".", 3)
    return f"blk.{layer}.{_LAYER_NAMES[rest]}"


def _permute_rotary_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter order: per head, the two rotary halves interleaved."""
    rows = weight.shape[0]
    rest = weight.shape[1:]
    return weight.reshape(heads, 2, rows // heads // 2, *rest).swapaxes(1, 2).reshape(rows, *rest)


def _encode(values: np.ndarray, type_name: str) -> tuple[np.ndarray, Any]:
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    qtype = GGMLQuantizationType[type_name]
    if type_name == "F32":
        return values.astype(np.float32), None
    if type_name == "F16":
        return values.astype(np.float16), None
    return quantize(values.astype(np.float32), qtype), qtype


def write_tiny_gguf(
    path: str | Path,
    arch: str = "llama",
    types: Sequence[str] = DEFAULT_TYPES,
    seed: int = 0,
    **config_overrides: Any,
) -> Path:
    """Write the file at `path` and return it; 2-D weights cycle through `types` in order."""
    import gguf
    from safetensors.torch import load_file

    if arch not in _ARCH_NAMES:
        raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(_ARCH_NAMES)}")
    if arch == "llama":
        config_overrides.setdefault("rope_scaling", None)  # llama.cpp stores llama3 RoPE apart
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = write_tiny_checkpoint(
            Path(tmp) / "ckpt", arch=arch, seed=seed, **config_overrides
        )
        config = json.loads((checkpoint / "config.json").read_text())
        tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
        tokenizer_config = json.loads((checkpoint / "tokenizer_config.json").read_text())
        weights = {}
        for file in sorted(checkpoint.glob("*.safetensors")):
            weights.update(load_file(str(file)))

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    name = _ARCH_NAMES[arch]
    writer = gguf.GGUFWriter(str(out), name)
    writer.add_name(f"tiny-random-{arch}")
    for method, config_key in _MODEL_FIELDS.items():
        getattr(writer, method)(config[config_key])

    vocab: dict[str, int] = dict(tokenizer["model"]["vocab"])
    specials = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    vocab.update(specials)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda item: item[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])
    writer.add_token_merges(merges)
    if config.get("bos_token_id") is not None:
        writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(vocab[tokenizer_config["eos_token"]])
    writer.add_pad_token_id(vocab[tokenizer_config["pad_token"]])
    writer.add_add_bos_token(config.get("bos_token_id") is not None)
    writer.add_chat_template(tokenizer_config["chat_template"])

    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    matrices = 0
    for hf_name in sorted(weights):
        values = weights[hf_name].to(torch.float32).numpy()
        if arch == "llama" and ".q_proj." in hf_name:
            values = _permute_rotary_rows(values, heads)
        elif arch == "llama" and ".k_proj." in hf_name:
            values = _permute_rotary_rows(values, kv_heads)
        type_name = "F32"
        if values.ndim == 2:
            type_name = types[matrices % len(types)]
            matrices += 1
        data, raw_dtype = _encode(values, type_name)
        writer.add_tensor(_gguf_name(hf_name), data, raw_dtype=raw_dtype)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
