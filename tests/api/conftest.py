"""A gateway in front of the native loopback upstreams (OpenAI, Azure OpenAI, Anthropic, an
engine fleet), for the front-door tests: one per module, with an API key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_runner import GatewayThread, make_settings
from native_gateway import KEY_ENV, NativeGateway, native_fleet, native_policy

# Models of the passed-through operations (audio, images, moderations) on each upstream.
OPERATION_MODELS = """
  whisper:
    provider: openai
    upstream_model: whisper-1
    price: {input: 6, output: 6}
  azure-whisper:
    provider: azure
    upstream_model: whisper-1
    price: {input: 6, output: 6}
  claude-whisper:
    provider: anthropic
    upstream_model: claude-sonnet-4
  image-editor:
    provider: openai
    upstream_model: gpt-image-1
    price: {input: 5, output: 40}
  tts:
    provider: openai
    upstream_model: tts-1
    price: {input: 15}
  moderation:
    provider: openai
    upstream_model: omni-moderation-latest
  fleet-whisper:
    provider: fleet
    upstream_model: whisper-large-v3
    price: {input: 6, output: 6}
  azure-embed:
    provider: azure
    upstream_model: text-embedding-3-small
    price: {input: 0.02}
"""


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[NativeGateway]:
    root: Path = tmp_path_factory.mktemp("native")
    with pytest.MonkeyPatch.context() as env, native_fleet() as fleet:
        for name, value in KEY_ENV.items():
            env.setenv(name, value)
        policy = root / "routing_rules.yaml"
        policy.write_text(native_policy(fleet, models=OPERATION_MODELS))
        settings = make_settings(root / "data", policy, redis_url, max_upload_bytes=256 * 1024)
        with GatewayThread(settings) as gateway:
            key_id, key = gateway.create_key(name="native")
            yield NativeGateway(gateway, fleet, key_id, key)
