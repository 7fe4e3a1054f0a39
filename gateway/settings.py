"""Gateway settings: environment variables with the ``SWITCHYARD_`` prefix (also read from .env).

``load_settings`` turns a bad value into ``SettingsError`` naming the variable, so start-up stops
with a message a human can act on. ``ensure_secrets`` fills in the admin key and the key pepper
from files under DATA_DIR (made 0700), generating them once (mode 0600) when they are not
configured.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.data_dir import private_dir
from gateway.ledger.store import check_store_url
from gateway.store.connect import check_redis_url

ENV_PREFIX = "SWITCHYARD_"


class SettingsError(ValueError):
    """A configuration value that stops start-up; the message names the variable."""


# The default policy shipped in the package (the repository root's routing_rules.yaml is a link
# to it): `switchyard serve` in a directory without a policy file serves it, `switchyard init`
# writes a copy. A path, not an import: settings stand below the routing part.
SHIPPED_POLICY = Path(__file__).parent / "routing" / "routing_rules.yaml"


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
    # Unset and missing: the shipped default policy is served (SHIPPED_POLICY).
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
    # Backoff between tries of one candidate: exponential from initial to max, plus jitter;
    # an upstream Retry-After is waited exactly, unless longer than max_retry_after_s.
    upstream_backoff_initial_s: float = Field(default=0.25, ge=0, le=60)
    upstream_backoff_max_s: float = Field(default=4.0, ge=0, le=600)
    upstream_backoff_jitter_s: float = Field(default=0.25, ge=0, le=60)
    upstream_max_retry_after_s: float = Field(default=10.0, ge=0, le=3600)
    # Circuit breaker per provider/model: opens after N consecutive failures, or at a failure
    # ratio over the last `window` calls (judged once `min_calls` are in); probes after cooldown.
    breaker_consecutive_failures: int = Field(default=5, ge=1, le=10_000)
    breaker_failure_ratio: float = Field(default=0.5, gt=0, le=1)
    breaker_window: int = Field(default=20, ge=1, le=10_000)
    breaker_min_calls: int = Field(default=10, ge=1, le=10_000)
    breaker_cooldown_s: float = Field(default=30.0, gt=0, le=86400)
    # Weight of the newest sample in the lowest_latency strategy's moving average.
    route_latency_alpha: float = Field(default=0.3, gt=0, le=1)
    upstream_pool_size: int = Field(default=512, ge=1, le=100_000)
    # Upstream answers are read up to these sizes, then refused with a 502 (nothing past the
    # cap is buffered). 64 MiB holds the largest legitimate answers: ten base64 images, or a
    # 2048-input embedding batch in base64 (the SDKs' default). An SSE event of a chat stream
    # is a few KiB; 1 MiB leaves room for big tool-call or logprob chunks.
    upstream_max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, le=4 * 1024**3)
    upstream_max_event_bytes: int = Field(default=1024 * 1024, ge=1024, le=256 * 1024**2)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=1024**3)
    # Multipart uploads (audio, image edits) are streamed through, never buffered, up to this.
    max_upload_bytes: int = Field(default=25 * 1024 * 1024, ge=1024, le=16 * 1024**3)
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
    # Traces (OTEL_* variables turn them on) carry prompts and completions only when this is set.
    trace_capture_prompts: bool = False
    # SIGTERM drain: readiness off, new requests 503, in-flight ones get this long to finish.
    shutdown_grace_s: float = Field(default=30.0, ge=0, le=3600)
    # Client-side limits (slow or oversized clients): the request line and headers must arrive
    # within header_timeout_s and fit max_header_bytes; the body within body_timeout_s.
    header_timeout_s: float = Field(default=10.0, gt=0, le=600)
    max_header_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    # Idle keep-alive connections are closed after this long.
    keep_alive_timeout_s: float = Field(default=5.0, gt=0, le=3600)
    # A bearer token /metrics asks for; unset = open (keep the port private then).
    metrics_token: SecretStr | None = None
    # The dashboard's session cookie carries `Secure` (browsers keep sending it to
    # http://localhost and 127.0.0.1, which count as secure contexts); false only for plain
    # http on another address.
    dashboard_cookie_secure: bool = True
    # Failed admin logins and admin bearers per client address: past `limit` in `window_s`,
    # that address gets 429 until the window ends.
    auth_failure_limit: int = Field(default=10, ge=1, le=1_000_000)
    auth_failure_window_s: float = Field(default=300.0, ge=1, le=86400)
    # Peers (IP addresses or CIDR networks, comma-separated) whose X-Forwarded-For and
    # X-Forwarded-Proto are believed; empty: none, the client is the TCP peer.
    trusted_proxies: str = ""
    # A request in flight counts against max_parallel_requests under a lease this long, renewed
    # by its gateway every third of it: a dead gateway's requests stop counting after at most
    # this long.
    inflight_lease_s: float = Field(default=30.0, ge=0.3, le=3600)
    # Budget alerts: the webhook they are POSTed to (empty: alerts are only logged), the key
    # their HMAC-SHA256 signature is made with, and the retry schedule of a failed delivery.
    alert_webhook_url: str = ""
    alert_webhook_secret: SecretStr | None = None
    alert_retry_initial_s: float = Field(default=1.0, gt=0, le=3600)
    alert_retry_max_s: float = Field(default=300.0, gt=0, le=86400)
    alert_max_attempts: int = Field(default=12, ge=1, le=100)
    alert_timeout_s: float = Field(default=10.0, gt=0, le=300)

    @field_validator("redis_url")
    @classmethod
    def _redis_url_form(cls, value: str) -> str:
        # redis://, rediss://, unix:// or redis+cluster://host:port[,host:port...]; empty = embedded
        check_redis_url(value.strip())
        return value.strip()

    @field_validator("upstream_backoff_max_s")
    @classmethod
    def _backoff_max_not_below_initial(cls, value: float, info: ValidationInfo) -> float:
        initial = info.data.get("upstream_backoff_initial_s")
        if initial is not None and value < initial:
            raise ValueError(f"must be at least {ENV_PREFIX}UPSTREAM_BACKOFF_INITIAL_S ({initial})")
        return value

    @field_validator("breaker_min_calls")
    @classmethod
    def _min_calls_fit_the_window(cls, value: int, info: ValidationInfo) -> int:
        window = info.data.get("breaker_window")
        if window is not None and value > window:
            raise ValueError(f"must not exceed {ENV_PREFIX}BREAKER_WINDOW ({window})")
        return value

    @property
    def embedded_redis(self) -> bool:
        return not self.redis_url

    @property
    def redis_dir(self) -> Path:
        return self.data_dir / "redis"

    @property
    def policy_fallback(self) -> Path | None:
        """The shipped default policy, served when POLICY_FILE is unset and missing (a file
        named explicitly must exist: a deployment naming a missing file is a mistake)."""
        if "policy_file" in self.model_fields_set or self.policy_file.exists():
            return None
        return SHIPPED_POLICY

    @property
    def policy_source(self) -> Path:
        """The policy file read at start: POLICY_FILE, or the shipped default in its stead."""
        return self.policy_fallback or self.policy_file

    # Usage events' SQL store: empty = embedded SQLite at DATA_DIR/usage/usage.sqlite3,
    # sqlite:///<path> = another file, postgresql://... = one PostgreSQL shared by replicas.
    usage_store_url: str = ""
    # Days of usage kept in the store, today included; older days are dropped whole.
    usage_retention_days: int = Field(default=400, ge=1, le=36_500)
    # The exporter (Redis buffer -> store): events per store insert, the pause between polls
    # once caught up, how long an entry read by a replica may sit unacknowledged before another
    # takes it over, and how often the store's maintenance (partitions, retention) runs.
    usage_export_batch: int = Field(default=1000, ge=1, le=10_000)
    usage_export_interval_s: float = Field(default=0.5, ge=0.01, le=60)
    usage_export_claim_idle_s: float = Field(default=30.0, ge=0.1, le=86_400)
    usage_maintain_interval_s: float = Field(default=3600.0, ge=1, le=86_400)
    # Batches (docs/batches.md): the largest input file, the most requests a batch may hold,
    # the lines one replica runs at once, the share of a key's and team's RPM and TPM that
    # batch lines may use, the lease a replica holds a line under (renewed while it runs;
    # another replica takes the line over once it lapses), how often the runner looks for
    # work, the longest back-off after a 429, and the share of the local engine's sequences
    # batch lines may fill (they are admitted only while no request waits). RUN_BATCHES=false:
    # this replica serves the batch API but runs no lines.
    batch_max_file_bytes: int = Field(default=100 * 1024 * 1024, ge=1024, le=2 * 1024**3)
    batch_max_lines: int = Field(default=50_000, ge=1, le=1_000_000)
    batch_concurrency: int = Field(default=16, ge=1, le=10_000)
    batch_limit_share: float = Field(default=0.5, gt=0, le=1)
    batch_lease_s: float = Field(default=30.0, ge=0.5, le=3600)
    batch_poll_interval_s: float = Field(default=0.5, ge=0.01, le=60)
    batch_backoff_max_s: float = Field(default=60.0, ge=0.1, le=3600)
    batch_local_share: float = Field(default=0.5, gt=0, le=1)
    run_batches: bool = True

    @field_validator("trusted_proxies")
    @classmethod
    def _trusted_proxies_form(cls, value: str) -> str:
        return ",".join(trusted_proxy_list(value))

    @field_validator("alert_webhook_url")
    @classmethod
    def _webhook_url_form(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL, or empty")
        return value

    @field_validator("alert_webhook_secret")
    @classmethod
    def _webhook_signed(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if info.data.get("alert_webhook_url") and (value is None or len(value) < 16):
            raise ValueError("needs at least 16 characters when ALERT_WEBHOOK_URL is set")
        return value

    @field_validator("usage_store_url")
    @classmethod
    def _usage_store_url_form(cls, value: str) -> str:
        return check_store_url(value)  # its errors never repeat a password


def trusted_proxy_list(value: str) -> list[str]:
    """The addresses and networks of a ``TRUSTED_PROXIES`` value, normalized; a ValueError
    for anything else (a host name or ``*`` would trust peers nobody listed)."""
    found: list[str] = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        try:
            found.append(
                str(ipaddress.ip_network(item, strict=False))
                if "/" in item
                else str(ipaddress.ip_address(item))
            )
        except ValueError:
            raise ValueError(
                f"{item[:60]!r} is not an IP address or CIDR network (list the proxies that "
                "connect to the gateway, comma-separated)"
            ) from None
    return found


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
    # Created with mode 0600 so the secret is never readable by others, not even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(make + "\n")
    os.chmod(path, 0o600)
    return make, True


def ensure_secrets(settings: Settings) -> Secrets:
    """Configured secrets win; otherwise read (or generate once) DATA_DIR/admin_key, key_pepper.

    DATA_DIR itself is made private (0700) here, the first thing every command does with it."""
    private_dir(settings.data_dir)
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
