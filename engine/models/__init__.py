"""Model architectures, keyed by the HF `architectures` name."""

from __future__ import annotations

from engine.models.llama import SUPPORTED_ARCHITECTURES, LlamaForCausalLM, ModelArgs

__all__ = ["SUPPORTED_ARCHITECTURES", "LlamaForCausalLM", "ModelArgs"]
