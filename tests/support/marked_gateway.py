"""Gateways whose secrets are marked, for the tests that look for leaks in what a gateway says.

The admin key, pepper and provider key carry ``OPSSECRET``: finding one in a client's answer
or in the captured output can only mean a leak. ``MarkedGateway`` is a ``GatewayProcess``
(``python -m gateway serve``, the embedded Redis unless ``redis_url`` is given) with them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway_runner import PEPPER as SESSION_REDIS_PEPPER
from gateway_runner import GatewayProcess, make_settings

from gateway.settings import Settings

ADMIN_KEY = "sy-admin-OPSSECRET-admin-0123456789"
PEPPER = "OPSSECRET-pepper-abcdef0123456789"
PROVIDER_KEY = "sk-provider-OPSSECRET-9876543210"
PROVIDER_KEY_ENV = "OPS_TEST_PROVIDER_KEY"

POLICY = """
providers:
  fake:
    base_url: {base_url}
    api_key_env: OPS_TEST_PROVIDER_KEY
    timeout_s: 30
models:
  fake-model:
    provider: fake
    price: {{input: 1000, output: 2000}}
  drip-model:
    provider: fake
    upstream_model: drip
    price: {{input: 1000, output: 2000}}
  embed-model:
    provider: fake
    price: {{input: 100}}
  image-model:
    provider: fake
aliases:
  fake: fake-model
"""


def write_policy(directory: Path, upstream_base_url: str) -> Path:
    path = directory / "routing_rules.yaml"
    path.write_text(POLICY.format(base_url=upstream_base_url))
    return path


class MarkedGateway(GatewayProcess):
    def __init__(self, data_dir: Path, policy_file: Path, **settings: Any) -> None:
        super().__init__(
            data_dir,
            policy_file,
            admin_key=ADMIN_KEY,
            pepper=PEPPER,
            env={PROVIDER_KEY_ENV: PROVIDER_KEY},
            **settings,
        )


def marked_settings(
    data_dir: Path, policy_file: Path, redis_url: str, **overrides: Any
) -> Settings:
    """Settings of an in-process gateway with the marked admin key, on the session Redis."""
    return make_settings(
        data_dir,
        policy_file,
        redis_url,
        admin_key=ADMIN_KEY,
        key_pepper=SESSION_REDIS_PEPPER,
        upstream_read_timeout_s=60.0,
        **overrides,
    )
