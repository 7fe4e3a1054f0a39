"""Load an HF-format checkpoint directory, a hub id or a GGUF file into an engine model.

`config.json` picks the architecture; `*.safetensors` (single file, or shards listed in
`model.safetensors.index.json`) supply the weights. A `.gguf` file is first turned into an
HF-format directory under the download dir (`engine.gguf.convert`, once per file), whose
weights are the GGUF's, kept quantized (`keep_quantized`) or dequantized while loading. AWQ and
GPTQ checkpoints (`quantization_config`) load the same two ways (`engine.quant.hf_formats`). Every failure is a `LoaderError` that names
the file or tensor at fault.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from engine.errors import LoaderError, UnsupportedModelError, WeightShapeError
from engine.gguf.convert import prepare_gguf, view_weights
from engine.kernels import Backend
from engine.layers.linear import (
    QuantizedSource,
    TensorSource,
    WeightSource,
    default_weight_loader,
)
from engine.models.llama import LlamaForCausalLM, ModelArgs, ParallelSpec
from engine.quant.hf_formats import assemble, check_config

INDEX_FILE = "model.safetensors.index.json"
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
DEFAULT_DOWNLOAD_DIR = Path("~/.cache/switchyard/models")


def resolve_model_path(model: str | Path, download_dir: str | Path | None = None) -> Path:
    """A local directory as is; a `.gguf` file as its HF-format view (made once under
    `download_dir`); otherwise a hub id fetched with `huggingface_hub` into `download_dir`."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    cache = Path(download_dir or DEFAULT_DOWNLOAD_DIR).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return prepare_gguf(path, cache)
    if path.exists():
        raise LoaderError(
            f"model path {str(path)!r} is a file, expected a checkpoint directory or a .gguf file"
        )
    name = str(model)
    if name.count("/") != 1 or name.startswith((".", "/", "~")):
        raise LoaderError(f"model directory {name!r} does not exist (and is not a hub id)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise LoaderError(
            f"{name!r} is not a local directory and huggingface_hub is missing"
        ) from exc
    try:
        local = snapshot_download(
            name,
            allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.model"],
            cache_dir=str(cache) if download_dir is not None else None,
        )
    except Exception as exc:  # offline, unknown repo, gated: all mean "cannot fetch"
        raise LoaderError(
            f"could not download {name!r} from the Hugging Face hub (offline or not found): {exc}"
        ) from exc
    return Path(local)


def read_config(path: Path) -> dict[str, Any]:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise LoaderError(f"missing config.json in {path}")
    try:
        return json.loads(config_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise LoaderError(f"config.json in {path} is not valid JSON: {exc}") from exc


def quantization_config(config: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """A checkpoint's `quantization_config` when the engine can serve it (AWQ, GPTQ; see
    `engine.quant.hf_formats`), None for a float checkpoint; a `LoaderError` with the reason
    for any other."""
    quantization = config.get("quantization_config")
    if quantization is None:
        return None
    if not isinstance(quantization, dict):
        raise LoaderError(f"checkpoint {path}: quantization_config is not an object")
    try:
        check_config(quantization)
    except LoaderError as exc:
        raise LoaderError(f"checkpoint {path} is quantized and cannot be served: {exc}") from exc
    return quantization


def load_model_args(path: Path) -> ModelArgs:
    config = read_config(path)
    quantization_config(config, path)
    try:
        return ModelArgs.from_hf_config(config)
    except UnsupportedModelError as exc:
        raise LoaderError(str(exc)) from exc
    except KeyError as exc:
        raise LoaderError(f"config.json in {path} lacks required field {exc}") from exc


def safetensors_files(path: Path) -> list[Path]:
    index = path / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        files = sorted({path / name for name in weight_map.values()})
        for file in files:
            if not file.is_file():
                raise LoaderError(f"missing weight shard {file.name} (listed in {INDEX_FILE})")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise LoaderError(f"missing weights: no *.safetensors file in {path}")
    return files


class SafetensorsSlice:
    """One checkpoint tensor, read lazily: a rank reads only the rows/columns it holds."""

    def __init__(self, handle: Any, name: str) -> None:
        self._slice = handle.get_slice(name)
        self.shape: tuple[int, ...] = tuple(self._slice.get_shape())

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        index = (slice(None),) * dim + (slice(start, start + length),)
        return self._slice[index]

    def full(self) -> torch.Tensor:
        return self._slice[:]


def _iter_tensors(path: Path, keep_quantized: bool) -> Iterator[tuple[str, WeightSource]]:
    gguf = view_weights(path)
    if gguf is not None:
        yield from gguf.tensors(keep_quantized)
        return
    quantization = quantization_config(read_config(path), path)
    if quantization is not None:
        yield from assemble(_safetensors(path), quantization)
    else:
        yield from _safetensors(path)


def _safetensors(path: Path) -> Iterator[tuple[str, WeightSource]]:
    from safetensors import safe_open

    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield name, SafetensorsSlice(handle, name)


def _count_tensors(path: Path) -> int:
    gguf = view_weights(path)
    if gguf is not None:
        return len(gguf)
    from safetensors import safe_open

    total = 0
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            total += len(list(handle.keys()))
    return total


def load_weights(
    model: LlamaForCausalLM, path: Path, progress: bool = True, keep_quantized: bool = False
) -> None:
    """Fill `model` from `path`. With `keep_quantized`, quantized weights (GGUF blocks, AWQ,
    GPTQ) stay quantized in the layers (`quantized`); otherwise they are dequantized."""
    from tqdm import tqdm

    if view_weights(path) is None:
        safetensors_files(path)  # a clear error now when the weights are missing
    params = dict(model.named_parameters())
    shards_needed = {name: 1 for name in params}
    for fused, _ in model.packed_modules_mapping.values():
        for name in params:
            if f".{fused}." in name:
                shards_needed[name] = sum(
                    1 for f, _ in model.packed_modules_mapping.values() if f == fused
                )
    shards_loaded = dict.fromkeys(params, 0)
    tied = model.args.tie_word_embeddings
    # no bar at all without progress: even a disabled tqdm creates a multiprocessing lock,
    # which a killed tensor-parallel rank would leak
    bar = (
        tqdm(total=_count_tensors(path), desc="Loading weights", unit="tensor")
        if progress
        else None
    )
    try:
        for name, source in _iter_tensors(path, keep_quantized):
            if not keep_quantized and isinstance(source, QuantizedSource):
                source = TensorSource(source.full())
            if bar is not None:
                bar.update(1)
            if name.endswith(IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
                continue
            target, shard_id = name, None
            for original, (fused, shard) in model.packed_modules_mapping.items():
                if f".{original}." in name:
                    target, shard_id = name.replace(f".{original}.", f".{fused}."), shard
                    break
            param = params.get(target)
            if param is None:
                continue  # extra tensors (e.g. other heads) do not matter to generation
            loader = getattr(param, "weight_loader", None)
            try:
                if loader is None:
                    default_weight_loader(param, source)
                elif shard_id is None:
                    loader(param, source)
                else:
                    loader(param, source, shard_id)
            except WeightShapeError as exc:
                raise LoaderError(f"tensor {name!r}: {exc}") from exc
            shards_loaded[target] += 1
    finally:
        if bar is not None:
            bar.close()
    missing = sorted(n for n, need in shards_needed.items() if shards_loaded[n] < need)
    if missing:
        raise LoaderError(f"checkpoint {path} lacks weights for: {', '.join(missing)}")
    for module_name, module in model.named_modules():
        finish = getattr(module, "finish_quantized", None)
        try:
            if finish is not None:
                finish()
        except WeightShapeError as exc:
            raise LoaderError(f"{module_name}: {exc}") from exc
    if tied:  # the head multiplies by the embedding's quantized rows
        model.lm_head.quantized = model.model.embed_tokens.quantized


def build_model(
    path: Path,
    args: ModelArgs,
    device: torch.device,
    dtype: torch.dtype,
    backend: Backend,
    progress: bool = True,
    tp: ParallelSpec | None = None,
    max_position: int | None = None,
    keep_quantized: bool = False,
) -> LlamaForCausalLM:
    """The model with only this rank's share of each weight (all of it when `tp` is None);
    `max_position` sizes the RoPE table (the longest sequence the engine will serve)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters are created in the target dtype directly
    try:
        with torch.device(device):
            model = LlamaForCausalLM(args, tp, backend=backend, max_position=max_position)
    finally:
        torch.set_default_dtype(previous)
    load_weights(model, path, progress=progress, keep_quantized=keep_quantized)
    return model.eval()
