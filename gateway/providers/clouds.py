"""The factories of the cloud provider kinds, for the registry: ``gemini``, ``vertex_ai`` and
``bedrock`` (each its own module; ``policy/clouds.py`` holds their policy blocks)."""

from __future__ import annotations

from gateway.providers.bedrock import BedrockProvider
from gateway.providers.gemini import GeminiProvider
from gateway.providers.http_upstream import UpstreamSettings
from gateway.providers.registry import ProviderFactory
from gateway.providers.vertex_ai import VertexAIProvider


def cloud_factories(upstream: UpstreamSettings) -> dict[str, ProviderFactory]:
    return {
        "gemini": lambda name, config: GeminiProvider(name, config, upstream),
        "vertex_ai": lambda name, config: VertexAIProvider(name, config, upstream),
        "bedrock": lambda name, config: BedrockProvider(name, config, upstream),
    }
