"""A provider's extra ``headers`` in the policy: a literal value, or ``{value_env: NAME}``, an
environment variable read when the provider is built (as ``api_key_env`` is).

A header that carries a credential (an org token, a gateway key of the upstream's own) belongs
in the environment, not the policy: the policy is shown to operators (``GET /admin/policy``),
and below the admin role every header value is masked there, literal or not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
MASKED = "[hidden]"


class HeaderFromEnv(BaseModel):
    """``{value_env: NAME}``: the header's value is the variable ``NAME``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    value_env: str = Field(
        pattern=ENV_NAME_PATTERN,
        max_length=200,
        description="env var holding the header's value; unset at runtime = provider unusable",
    )


HeaderValue = str | HeaderFromEnv


def header_values(headers: Mapping[str, HeaderValue], env: Mapping[str, str]) -> dict[str, str]:
    """The headers as sent: literals as written, ``value_env`` ones from ``env`` (an unset or
    empty variable leaves its header out; ``missing_header_env`` names it)."""
    values: dict[str, str] = {}
    for name, value in headers.items():
        resolved = value if isinstance(value, str) else env.get(value.value_env)
        if resolved:
            values[name] = resolved
    return values


def missing_header_env(headers: Mapping[str, HeaderValue], env: Mapping[str, str]) -> str | None:
    """The first ``value_env`` variable that ``env`` does not set (or sets empty), else None."""
    for value in headers.values():
        if not isinstance(value, str) and not env.get(value.value_env):
            return value.value_env
    return None


def masked_policy(dumped: dict[str, Any]) -> dict[str, Any]:
    """A dumped policy (``model_dump(mode="json")``) with every literal header value replaced
    by ``MASKED``; a ``value_env`` reference names a variable, not a secret, and stays."""
    providers = {
        name: {
            **provider,
            "headers": {
                header: value if isinstance(value, dict) else MASKED
                for header, value in (provider.get("headers") or {}).items()
            },
        }
        for name, provider in (dumped.get("providers") or {}).items()
    }
    return {**dumped, "providers": providers}
