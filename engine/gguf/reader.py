"""Read a GGUF checkpoint as what the HF-format loader expects: a config and named tensors.

`GGUFCheckpoint(path)` maps llama.cpp's metadata to HF `config.json` fields (`hf_config()`) and
its tensors to HF names and file offsets (`tensor_table()`); `GGUFWeights(path, table)` then
reads them through a memory map, dequantized to float32 one at a time by `engine.gguf.dequant`,
or kept in their quantized blocks (`engine.gguf.planes`) for the layers that multiply by them. llama.cpp stores the Llama q/k projections with their rows permuted for
its rotary layout; they are put back here. Supported architectures: llama (Llama, Mistral,
SmolLM), qwen2 and qwen3. Anything this engine would compute wrongly (another architecture, a
RoPE scaling it does not implement, per-dimension `rope_freqs`) is a `LoaderError` that names
it, never a silent approximation.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.errors import LoaderError
from engine.gguf.dequant import dequantize
from engine.gguf.planes import KEPT_TYPES, quantized_weight
from engine.layers.linear import QuantizedSource, TensorSource, WeightSource
from engine.quant.weight import QuantizedWeight

# GGUF `general.architecture` -> HF `architectures[0]`
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAME = re.compile(r"^blk\.(\d+)\.(.+)$")


def hf_tensor_name(name: str) -> str | None:
    """The HF name of a llama.cpp tensor name; None for one this engine has no use for."""
    if name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[name]
    match = _LAYER_NAME.match(name)
    if match and match.group(2) in _LAYER_TENSORS:
        return f"model.layers.{match.group(1)}.{_LAYER_TENSORS[match.group(2)]}"
    return None


def unpermute_rotary_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order (pairs interleaved per head) back to HF's halves."""
    rows = weight.shape[0]
    head_dim = rows // num_heads
    rest = weight.shape[1:]
    return (
        weight.reshape(num_heads, head_dim // 2, 2, *rest)
        .transpose(1, 2)
        .reshape(rows, *rest)
        .contiguous()
    )


class GGUFCheckpoint:
    """One `.gguf` file, memory-mapped; nothing is dequantized until `tensors()` is walked."""

    def __init__(self, path: str | Path) -> None:
        try:
            from gguf import GGUFReader
        except ImportError as exc:  # pragma: no cover - gguf is in the engine extra
            raise LoaderError("reading a .gguf checkpoint needs the `gguf` package") from exc
        self.path = Path(path)
        try:
            self._reader = GGUFReader(str(self.path))
        except (OSError, ValueError) as exc:
            raise LoaderError(f"{self.path} is not a readable GGUF file: {exc}") from exc
        self.metadata: dict[str, Any] = {}
        for key, field in self._reader.fields.items():
            if key.startswith("GGUF."):
                continue
            self.metadata[key] = field.contents()
        self.architecture = str(self.metadata.get("general.architecture", ""))
        if self.architecture not in ARCHITECTURES:
            raise LoaderError(
                f"GGUF architecture {self.architecture!r} is not supported; "
                f"supported: {', '.join(ARCHITECTURES)}"
            )
        self._tensor_names = {t.name for t in self._reader.tensors}
        if "rope_freqs.weight" in self._tensor_names:
            raise LoaderError(
                "GGUF tensor rope_freqs.weight (per-dimension RoPE frequency factors, as in "
                "Llama 3.1 files) is not supported"
            )

    def _arch(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def _required(self, key: str) -> Any:
        value = self._arch(key)
        if value is None:
            raise LoaderError(f"GGUF metadata lacks {self.architecture}.{key}")
        return value

    def tensor_types(self) -> dict[str, str]:
        """llama.cpp tensor name -> GGML type name (F32, Q4_1, ...)."""
        return {t.name: t.tensor_type.name for t in self._reader.tensors}

    def hf_config(self) -> dict[str, Any]:
        """`config.json` fields for this file, as HF `transformers` would derive them."""
        hidden = int(self._required("embedding_length"))
        heads = int(self._required("attention.head_count"))
        vocab = self._arch("vocab_size") or len(self.metadata.get("tokenizer.ggml.tokens") or [])
        if not vocab:
            raise LoaderError(f"GGUF metadata gives no {self.architecture}.vocab_size")
        head_dim = self._arch("attention.key_length") or self._arch("rope.dimension_count")
        config: dict[str, Any] = {
            "architectures": [ARCHITECTURES[self.architecture]],
            "model_type": self.architecture,
            "hidden_size": hidden,
            "intermediate_size": int(self._required("feed_forward_length")),
            "num_hidden_layers": int(self._required("block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(self._arch("attention.head_count_kv") or heads),
            "head_dim": int(head_dim or hidden // heads),
            "rms_norm_eps": float(self._arch("attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": float(self._arch("rope.freq_base", 10000.0)),
            "max_position_embeddings": int(self._arch("context_length", 4096)),
            "vocab_size": int(vocab),
            "tie_word_embeddings": "output.weight" not in self._tensor_names,
            "hidden_act": "silu",
            "torch_dtype": self._serving_dtype(),
        }
        if self.architecture == "qwen2":
            config["attention_bias"] = True
        rope_scaling = self._rope_scaling()
        if rope_scaling is not None:
            config["rope_scaling"] = rope_scaling
        for key in ("bos_token_id", "eos_token_id", "padding_token_id"):
            value = self.metadata.get(f"tokenizer.ggml.{key}")
            if value is not None:
                config[key.replace("padding", "pad")] = int(value)
        return config

    def _rope_scaling(self) -> dict[str, Any] | None:
        kind = self._arch("rope.scaling.type")
        if kind in (None, "none"):
            return None
        if kind == "linear":
            return {"rope_type": "linear", "factor": float(self._required("rope.scaling.factor"))}
        raise LoaderError(f"GGUF RoPE scaling {kind!r} is not supported; supported: linear")

    def _serving_dtype(self) -> str:
        """What `dtype: auto` serves on CUDA: the file's float type, else bfloat16."""
        types = set(self.tensor_types().values())
        if types <= {"F32", "F16"} and "F16" in types:
            return "float16"
        if types <= {"F32"}:
            return "float32"
        return "bfloat16"

    def tensor_table(self) -> list[dict[str, Any]]:
        """Where each tensor the engine uses lies in the file: what `GGUFWeights` reads."""
        heads = int(self._required("attention.head_count"))
        kv_heads = int(self._arch("attention.head_count_kv") or heads)
        permuted = self.architecture == "llama"
        table = []
        for tensor in self._reader.tensors:
            name = hf_tensor_name(tensor.name)
            if name is None:
                continue
            rotary_heads = None
            if permuted and tensor.name.endswith(("attn_q.weight", "attn_q.bias")):
                rotary_heads = heads
            elif permuted and tensor.name.endswith(("attn_k.weight", "attn_k.bias")):
                rotary_heads = kv_heads
            table.append(
                {
                    "name": name,
                    "gguf_name": tensor.name,
                    "type": tensor.tensor_type.name,
                    "shape": [int(n) for n in reversed(tensor.shape.tolist())],
                    "offset": int(tensor.data_offset),
                    "nbytes": int(tensor.n_bytes),
                    "rotary_heads": rotary_heads,
                }
            )
        return table


class GGUFWeights:
    """The tensors of a GGUF file, found through a `tensor_table()` made earlier: loading needs
    no metadata parse (tens of thousands of vocabulary strings), only a memory map."""

    def __init__(self, path: str | Path, table: list[dict[str, Any]]) -> None:
        self.path = Path(path)
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def tensors(self, keep_quantized: bool = False) -> Iterator[tuple[str, WeightSource]]:
        """(HF name, float32 tensor) for every tensor the engine uses, read one at a time;
        with `keep_quantized`, 2-D weights of a quantized type come as a `QuantizedSource`."""
        try:
            mapped = np.memmap(self.path, dtype=np.uint8, mode="r")
        except OSError as exc:
            raise LoaderError(f"cannot read GGUF weights {self.path}: {exc}") from exc
        for entry in self.table:
            start, size = entry["offset"], entry["nbytes"]
            if start + size > mapped.shape[0]:
                raise LoaderError(f"GGUF tensor {entry['gguf_name']!r} lies past the end of file")
            raw = torch.from_numpy(np.array(mapped[start : start + size]))
            shape = tuple(entry["shape"])
            if keep_quantized and entry["type"] in KEPT_TYPES and len(shape) == 2:
                weight = quantized_weight(raw, entry["type"], shape)
                if entry["rotary_heads"]:
                    weight = QuantizedWeight(
                        *(unpermute_rotary_rows(plane, entry["rotary_heads"]) for plane in
                          (weight.codes, weight.scales, weight.offsets)),
                        weight.bits, weight.group_size, weight.source_format,
                    )  # fmt: skip
                yield entry["name"], QuantizedSource(weight)
                continue
            try:
                values = dequantize(raw, entry["type"], tuple(entry["shape"]))
            except LoaderError as exc:
                raise LoaderError(f"GGUF tensor {entry['gguf_name']!r}: {exc}") from exc
            if entry["rotary_heads"]:
                values = unpermute_rotary_rows(values, entry["rotary_heads"])
            yield entry["name"], TensorSource(values)
