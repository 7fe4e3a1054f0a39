"""The Llama family: Llama 2/3.x, Mistral, Qwen2/2.5 (qkv bias), Qwen3 (per-head q/k norm).

All share GQA attention with RoPE, RMSNorm, a SwiGLU MLP and tied or untied embeddings;
the differences are switches in `ModelArgs`. Module names follow HF's, except that q/k/v
and gate/up are fused (`packed_modules_mapping` tells the loader how).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from engine.errors import UnsupportedModelError
from engine.kernels import Backend
from engine.kernels.reference import AttentionMetadata
from engine.layers.activation import SiluAndMul
from engine.layers.attention import Attention
from engine.layers.linear import (
    MergedColumnParallelLinear,
    ParallelLMHead,
    ParallelSpec,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from engine.layers.norm import RMSNorm
from engine.layers.rotary import Angles, RotaryEmbedding, rotate, rotate_heads

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)


@dataclass
class ModelArgs:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    mlp_bias: bool
    torch_dtype: str | None
    sliding_window: int | None
    eos_token_id: list[int] = field(default_factory=list)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelArgs:
        architectures = config.get("architectures") or []
        architecture = next((a for a in architectures if a in SUPPORTED_ARCHITECTURES), None)
        if architecture is None:
            raise UnsupportedModelError(
                f"unsupported architecture {architectures or config.get('model_type')!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if config.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"unsupported hidden_act {config['hidden_act']!r}")
        rope_parameters = config.get("rope_parameters") or {}
        rope_theta = config.get("rope_theta", rope_parameters.get("rope_theta", 10000.0))
        rope_scaling = config.get("rope_scaling") or rope_parameters or None
        if rope_scaling and (rope_scaling.get("rope_type") or rope_scaling.get("type")) in (
            None,
            "default",
        ):
            rope_scaling = None
        num_heads = config["num_attention_heads"]
        eos = config.get("eos_token_id")
        use_sliding = config.get("use_sliding_window", architecture == "MistralForCausalLM")
        return cls(
            architecture=architecture,
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            max_position_embeddings=config.get("max_position_embeddings", 4096),
            tie_word_embeddings=config.get("tie_word_embeddings", False),
            qkv_bias=architecture == "Qwen2ForCausalLM" or config.get("attention_bias", False),
            qk_norm=architecture == "Qwen3ForCausalLM",
            mlp_bias=config.get("mlp_bias", False),
            torch_dtype=config.get("torch_dtype") or config.get("dtype"),
            sliding_window=config.get("sliding_window") if use_sliding else None,
            eos_token_id=[eos] if isinstance(eos, int) else list(eos or []),
        )


class DecoderAttention(nn.Module):
    def __init__(self, args: ModelArgs, tp: ParallelSpec, backend: Backend) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(
            args.hidden_size,
            args.head_dim,
            args.num_heads,
            args.num_kv_heads,
            bias=args.qkv_bias,
            tp=tp,
        )
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = args.head_dim
        self.o_proj = RowParallelLinear(args.num_heads * args.head_dim, args.hidden_size, False, tp)
        if args.qk_norm:
            self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps, backend)
            self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps, backend)
        self.qk_norm = args.qk_norm
        self.attn = Attention(
            self.num_heads, self.num_kv_heads, args.head_dim, args.head_dim**-0.5, backend
        )

    def forward(
        self, angles: Angles, hidden: torch.Tensor, meta: AttentionMetadata | None
    ) -> torch.Tensor:
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        qkv = self.qkv_proj(hidden)
        if self.qk_norm:
            q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
            q = self.q_norm(q.reshape(-1, self.num_heads, self.head_dim))
            k = self.k_norm(k.reshape(-1, self.num_kv_heads, self.head_dim))
            q, k = rotate(angles, q, k)
        else:  # query and key heads rotated together: half the calls per layer
            qk, v = qkv.split([q_size + kv_size, kv_size], dim=-1)
            qk = rotate_heads(
                angles, qk.reshape(-1, self.num_heads + self.num_kv_heads, self.head_dim)
            )
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        return self.o_proj(self.attn(q, k, v, meta))


class DecoderMLP(nn.Module):
    def __init__(self, args: ModelArgs, tp: ParallelSpec, backend: Backend) -> None:
        super().__init__()
        size = args.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(
            args.hidden_size, [size, size], args.mlp_bias, tp
        )
        self.down_proj = RowParallelLinear(size, args.hidden_size, args.mlp_bias, tp)
        self.act_fn = SiluAndMul(backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, tp: ParallelSpec, backend: Backend) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(args, tp, backend)
        self.mlp = DecoderMLP(args, tp, backend)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, backend)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, backend)

    def forward(
        self,
        angles: Angles,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        meta: AttentionMetadata | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(angles, hidden, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(
        self, args: ModelArgs, tp: ParallelSpec, backend: Backend, max_position: int
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(args.vocab_size, args.hidden_size, tp)
        # cos/sin for positions [0, max_position): shared, since every layer rotates alike
        self.rotary_emb = RotaryEmbedding(
            args.head_dim, max_position, args.rope_theta, args.rope_scaling
        )
        self.layers = nn.ModuleList(DecoderLayer(args, tp, backend) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, backend)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata | None
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual = None
        angles = self.rotary_emb.angles(positions)  # once per step, for every layer
        for layer in self.layers:
            hidden, residual = layer(angles, hidden, residual, meta)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    # checkpoint name -> (fused module name, shard id)
    packed_modules_mapping: ClassVar[dict[str, tuple[str, str | int]]] = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(
        self,
        args: ModelArgs,
        tp: ParallelSpec | None = None,
        backend: Backend = "torch",
        max_position: int | None = None,
    ) -> None:
        """`max_position`: the longest sequence served (the RoPE table's rows); by default
        the checkpoint's `max_position_embeddings`."""
        super().__init__()
        tp = tp or ParallelSpec()
        self.args = args
        self.model = LlamaModel(args, tp, backend, max_position or args.max_position_embeddings)
        self.lm_head = ParallelLMHead(args.vocab_size, args.hidden_size, tp)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata | None
    ) -> torch.Tensor:
        return self.model(input_ids, positions, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]
