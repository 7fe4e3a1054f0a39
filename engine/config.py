"""Engine settings, named and meant as in vLLM, validated up front with clear messages."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.errors import ConfigError

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class EngineConfig:
    model: str = ""  # HF directory, hub id, or a .gguf file
    dtype: str = "auto"  # auto|float32|float16|bfloat16 (auto: checkpoint dtype, fp32 on CPU)
    device: str = "auto"  # auto|cuda|cpu
    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    block_size: int = 16
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    enforce_eager: bool = False
    kv_cache_bytes: int = 256 * 1024 * 1024  # CPU pool size
    num_gpu_blocks: int | None = None  # explicit pool size; overrides both sizings
    attention_backend: str = "auto"  # auto|torch|triton
    seed: int = 0
    tokenizer: str | None = None  # defaults to `model`
    download_dir: str | None = None  # hub downloads and GGUF views; None: ~/.cache/switchyard
    tensor_parallel_size: int = 1  # ranks (worker processes) the model is sharded over
    # prepare step N+1 while step N runs; None: on for a single CUDA rank, off elsewhere
    async_scheduling: bool | None = None
    # vLLM's: "auto" takes the checkpoint's generation_config.json sampling defaults, "vllm"
    # ignores them, a directory reads its file; the override goes over either
    generation_config: str = "auto"
    override_generation_config: dict[str, Any] | None = None
    # quantized checkpoints (GGUF blocks, AWQ, GPTQ): "auto" keeps the weights quantized where
    # a kernel multiplies them (the CPU, one rank, float32), "none" dequantizes them at load
    quantization: str = "auto"
    # how the CPU's linears multiply: "auto" times the candidates on the machine at load
    # (cached under kernel_cache_dir); "torch", "onednn" or "native" force one
    linear_kernel: str = "auto"
    kernel_cache_dir: str | None = None  # None: "kernels" beside download_dir
    # where AsyncEngine's step thread runs beside the event loop reading it (core/host_placement.py):
    # "auto" measures one CPU against free on the decode steps and keeps the cheaper
    host_threads: str = "auto"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.dtype not in ("auto", *_DTYPES):
            raise ConfigError(
                f"dtype must be auto, float32, float16 or bfloat16, not {self.dtype!r}"
            )
        if self.device not in ("auto", "cuda", "cpu"):
            raise ConfigError(f"device must be auto, cuda or cpu, not {self.device!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], not {self.gpu_memory_utilization}"
            )
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ConfigError(f"block_size must be a positive power of two, not {self.block_size}")
        if self.max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs must be >= 1, not {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ConfigError(
                f"max_num_batched_tokens must be >= 1, not {self.max_num_batched_tokens}"
            )
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"max_model_len must be >= 1, not {self.max_model_len}")
        if (
            not self.enable_chunked_prefill
            and self.max_model_len is not None
            and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ConfigError(
                f"without chunked prefill, max_num_batched_tokens ({self.max_num_batched_tokens})"
                f" must be >= max_model_len ({self.max_model_len})"
            )
        if self.kv_cache_bytes <= 0:
            raise ConfigError(f"kv_cache_bytes must be > 0, not {self.kv_cache_bytes}")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ConfigError(f"num_gpu_blocks must be >= 1, not {self.num_gpu_blocks}")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ConfigError(
                f"attention_backend must be auto, torch or triton, not {self.attention_backend!r}"
            )

        if (
            isinstance(self.tensor_parallel_size, bool)
            or not isinstance(self.tensor_parallel_size, int)
            or self.tensor_parallel_size < 1
        ):
            raise ConfigError(
                f"tensor_parallel_size must be an integer >= 1, not {self.tensor_parallel_size!r}"
            )

        if not isinstance(self.generation_config, str) or not self.generation_config:
            raise ConfigError(
                f"generation_config must be auto, vllm or a directory, not {self.generation_config!r}"
            )

        if self.quantization not in ("auto", "none"):
            raise ConfigError(f"quantization must be auto or none, not {self.quantization!r}")
        if self.linear_kernel not in ("auto", "torch", "onednn", "native"):
            raise ConfigError(
                f"linear_kernel must be auto, torch, onednn or native, not {self.linear_kernel!r}"
            )

        if self.host_threads not in ("auto", "one-cpu", "free"):
            raise ConfigError(
                f"host_threads must be auto, one-cpu or free, not {self.host_threads!r}"
            )

        if self.async_scheduling and self.tensor_parallel_size > 1:
            raise ConfigError("async_scheduling needs tensor_parallel_size 1")

    def validate_tensor_parallel(
        self, num_heads: int, num_kv_heads: int, intermediate_size: int, device: torch.device
    ) -> None:
        """Checks that need the model's shape and the machine: heads split, ranks exist."""
        tp = self.tensor_parallel_size
        if num_heads % tp:
            raise ConfigError(
                f"tensor_parallel_size ({tp}) must divide num_attention_heads ({num_heads})"
            )
        if num_kv_heads % tp and tp % num_kv_heads:
            raise ConfigError(
                f"tensor_parallel_size ({tp}) must divide num_key_value_heads ({num_kv_heads})"
                " or be a multiple of it (then KV heads are replicated)"
            )
        if intermediate_size % tp:
            raise ConfigError(
                f"tensor_parallel_size ({tp}) must divide intermediate_size ({intermediate_size})"
            )
        if device.type == "cuda":
            available, what = torch.cuda.device_count(), "CUDA devices"
        else:
            available, what = os.cpu_count() or 1, "CPU cores"
        if tp > available:
            raise ConfigError(
                f"tensor_parallel_size ({tp}) exceeds the {available} {what} available"
            )

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device='cuda' was requested but no CUDA device is available")
        return torch.device(self.device)

    def resolve_kernel_cache_dir(self) -> Path:
        """Where compiled CPU kernels and the linear-kernel choices are kept: DATA_DIR/kernels
        under the gateway, whose download_dir is DATA_DIR/models."""
        if self.kernel_cache_dir:
            return Path(self.kernel_cache_dir).expanduser()
        models = Path(self.download_dir or "~/.cache/switchyard/models").expanduser()
        return models.parent / "kernels"

    def keeps_quantized(self, device: torch.device, dtype: torch.dtype) -> bool:
        """Quantized weights stay quantized where a tested kernel multiplies them: the CPU,
        one rank, float32 activations (elsewhere they are dequantized at load)."""
        return (
            self.quantization == "auto"
            and device.type == "cpu"
            and dtype == torch.float32
            and self.tensor_parallel_size == 1
        )

    def resolve_dtype(self, checkpoint_dtype: str | None, device: torch.device) -> torch.dtype:
        """`auto` keeps the checkpoint's dtype on CUDA and uses fp32 on the CPU."""
        if self.dtype != "auto":
            return _DTYPES[self.dtype]
        if device.type != "cuda":
            return torch.float32
        return _DTYPES.get(checkpoint_dtype or "", torch.bfloat16)
