"""The routing policy (``routing_rules.yaml``): pydantic schema, loading and validation.

This is the foundation's minimal schema (providers, models with prices, aliases); the routing
work extends it with tasks, strategies, fallbacks and canaries, keeping these names.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class PolicyError(ValueError):
    """An invalid policy; ``path`` is the dotted field path (``models.gpt-4.1.price.input``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProviderConfig(_Strict):
    kind: Literal["openai_compatible", "local"] = "openai_compatible"
    base_url: str | None = None
    api_key_env: str | None = None
    timeout_s: float = Field(default=60.0, gt=0)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    max_concurrency: int | None = Field(default=None, gt=0)
    headers: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _needs_url(self) -> ProviderConfig:
        if self.kind == "openai_compatible" and not self.base_url:
            raise ValueError("base_url is required for an openai_compatible provider")
        return self


class Price(_Strict):
    """USD per 1M tokens."""

    input: float = Field(default=0.0, ge=0)
    output: float = Field(default=0.0, ge=0)
    cached_input: float | None = Field(default=None, ge=0)

    def cost_usd(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        cached_rate = self.input if self.cached_input is None else self.cached_input
        uncached = max(prompt_tokens - cached_tokens, 0)
        return (
            uncached * self.input + cached_tokens * cached_rate + completion_tokens * self.output
        ) / 1_000_000


class ModelConfig(_Strict):
    provider: str
    upstream_model: str | None = None
    price: Price = Field(default_factory=Price)
    context_window: int | None = Field(default=None, gt=0)
    capabilities: list[str] = Field(default_factory=list)
    description: str | None = None


class Policy(_Strict):
    providers: dict[str, ProviderConfig]
    models: dict[str, ModelConfig]
    aliases: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _references(self) -> Policy:
        for name, model in self.models.items():
            if model.provider not in self.providers:
                raise PolicyError(f"models.{name}.provider", f"unknown provider {model.provider!r}")
        for alias, target in self.aliases.items():
            if target not in self.models:
                raise PolicyError(f"aliases.{alias}", f"points to unknown model {target!r}")
            if alias in self.models:
                raise PolicyError(f"aliases.{alias}", "an alias may not shadow a model name")
        return self

    def resolve_model(self, name: str) -> str | None:
        """Model name after alias resolution, or None when neither exists."""
        if name in self.models:
            return name
        return self.aliases.get(name)

    def upstream_model(self, name: str) -> str:
        return self.models[name].upstream_model or name


def _error_path(error: dict) -> str:
    return ".".join(str(part) for part in error["loc"] if part not in ("function-after",))


def parse_policy(text: str) -> Policy:
    """Parse YAML text into a validated Policy, or raise PolicyError naming the field."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError("", f"invalid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise PolicyError("", "the policy must be a YAML mapping")
    try:
        return Policy.model_validate(data)
    except PolicyError:
        raise
    except ValidationError as exc:
        first = exc.errors()[0]
        context_error = first.get("ctx", {}).get("error")
        if isinstance(context_error, PolicyError):
            raise context_error from exc
        raise PolicyError(_error_path(first), first["msg"]) from exc


def load_policy_file(path: Path | str) -> Policy:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PolicyError("", f"cannot read policy file {path}: {exc.strerror}") from exc
    return parse_policy(text)


def policy_version(text: str) -> str:
    """Content hash: the version recorded with each usage event."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]
