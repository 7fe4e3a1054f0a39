"""Gateway settings: environment variables with the ``SWITCHYARD_`` prefix (also read from .env).

``load_settings`` turns a bad value into ``SettingsError`` naming the variable, so start-up stops
with a message a human can act on. ``ensure_secrets`` fills in the admin key and the key pepper
from files under DATA_DIR, generating them once (mode 0600) when they are not configured.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.redis_connect import check_redis_url

ENV_PREFIX = "SWITCHYARD_"


class SettingsError(ValueError):
    """A configuration value that stops start-up; the message names the variable."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_file=".env", extra="ignore", validate_default=True
    )

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    redis_url: str = ""
    data_dir: Path = Path("./var")
    admin_key: SecretStr | None = None
    key_pepper: SecretStr | None = None
    policy_file: Path = Path("./routing_rules.yaml")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console"] = "json"
    # Upstream HTTP: connect, per-read (between bytes) and whole-request limits in seconds.
    upstream_connect_timeout_s: float = Field(default=5.0, gt=0, le=600)
    upstream_read_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    upstream_total_timeout_s: float = Field(default=600.0, gt=0, le=86400)
    # Tries per candidate (retries on connect errors, timeouts, 429 and 5xx) and the time
    # budget of all tries and fallbacks of one request.
    upstream_max_tries: int = Field(default=3, ge=1, le=10)
    upstream_retry_budget_s: float = Field(default=30.0, gt=0, le=3600)
    upstream_pool_size: int = Field(default=512, ge=1, le=100_000)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=1024**3)
    # When Redis is down: closed -> 503; open -> recently verified keys are served unlimited.
    limits_on_redis_failure: Literal["closed", "open"] = "closed"
    fail_open_window_s: float = Field(default=300.0, ge=0, le=86400)
    # How long a verified key is trusted without asking Redis; revocation must land within 1 s.
    auth_cache_ttl_s: float = Field(default=0.5, ge=0, le=1.0)
    # Token estimate for the limiter when a request has no max_tokens.
    default_max_tokens: int = Field(default=256, ge=1, le=1_000_000)
    redis_timeout_s: float = Field(default=1.0, gt=0, le=60)
    redis_supervise_interval_s: float = Field(default=1.0, gt=0, le=60)
    access_log: bool = True
    # SIGTERM drain: readiness off, new requests 503, in-flight ones get this long to finish.
    shutdown_grace_s: float = Field(default=30.0, ge=0, le=3600)
    # Client-side limits (slow or oversized clients): the request line and headers must arrive
    # within header_timeout_s and fit max_header_bytes; the body within body_timeout_s.
    header_timeout_s: float = Field(default=10.0, gt=0, le=600)
    max_header_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    # Idle keep-alive connections are closed after this long.
    keep_alive_timeout_s: float = Field(default=5.0, gt=0, le=3600)

    @field_validator("redis_url")
    @classmethod
    def _redis_url_form(cls, value: str) -> str:
        # redis://, rediss://, unix:// or redis+cluster://host:port[,host:port...]; empty = embedded
        check_redis_url(value.strip())
        return value.strip()

    @property
    def embedded_redis(self) -> bool:
        return not self.redis_url

    @property
    def redis_dir(self) -> Path:
        return self.data_dir / "redis"


def load_settings(**overrides: object) -> Settings:
    """Build Settings from the environment (and overrides), naming the variable on error."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else "?"
            problems.append(f"{ENV_PREFIX}{field.upper()}: {error['msg']}")
        raise SettingsError("invalid configuration: " + "; ".join(problems)) from exc


@dataclass(frozen=True)
class Secrets:
    admin_key: str
    key_pepper: bytes
    admin_key_generated: bool


def _read_or_create(path: Path, make: str) -> tuple[str, bool]:
    if path.exists():
        value = path.read_text().strip()
        if value:
            return value, False
    path.parent.mkdir(parents=True, exist_ok=True)
    # Created with mode 0600 so the secret is never readable by others, not even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(make + "\n")
    os.chmod(path, 0o600)
    return make, True


def ensure_secrets(settings: Settings) -> Secrets:
    """Configured secrets win; otherwise read (or generate once) DATA_DIR/admin_key, key_pepper."""
    generated = False
    if settings.admin_key is not None and settings.admin_key.get_secret_value():
        admin_key = settings.admin_key.get_secret_value()
    else:
        admin_key, generated = _read_or_create(
            settings.data_dir / "admin_key", "sy-admin-" + secrets.token_urlsafe(32)
        )
    if settings.key_pepper is not None and settings.key_pepper.get_secret_value():
        pepper = settings.key_pepper.get_secret_value()
    else:
        pepper, _ = _read_or_create(settings.data_dir / "key_pepper", secrets.token_hex(32))
    if len(pepper) < 16:
        raise SettingsError(f"{ENV_PREFIX}KEY_PEPPER: must be at least 16 characters")
    if len(admin_key) < 16:
        raise SettingsError(f"{ENV_PREFIX}ADMIN_KEY: must be at least 16 characters")
    return Secrets(admin_key, pepper.encode(), generated)
