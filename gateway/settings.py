"""Gateway settings: environment variables with the ``SWITCHYARD_`` prefix (also read from .env).

One ``Settings``: the general settings, and one nested ``Section`` per part that reads a group
(``settings.retry`` for the dispatcher, ``settings.breaker``...), handed to that part as it is.
The variables stay flat (``SWITCHYARD_UPSTREAM_MAX_TRIES`` is
``settings.retry.max_tries_per_candidate``): each section field names its variable as its
alias, and the environment sources read them into the section (``_WithSections``).

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
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from gateway.data_dir import private_dir
from gateway.ledger.store import check_store_url
from gateway.store.connect import check_redis_url

ENV_PREFIX = "SWITCHYARD_"


class SettingsError(ValueError):
    """A configuration value that stops start-up; the message names the variable."""


# The default policy shipped in the package (the repository root's routing_rules.yaml is a link
# to it): `switchyard serve` in a directory without a policy file serves it, `switchyard init`
# writes a copy. A path, not an import: settings stand below the policy part.
SHIPPED_POLICY = Path(__file__).parent / "policy" / "routing_rules.yaml"


class Section(BaseModel):
    """One part's group of settings inside ``Settings``. Each field reads the flat
    ``SWITCHYARD_*`` variable its ``validation_alias`` names (``Settings`` gathers them), so the
    variables are the same as before sections; code and tests may set a field by its name."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        validate_by_name=True,
        validate_by_alias=True,
        validate_default=True,
    )

    @classmethod
    def variables(cls) -> dict[str, str]:
        """Each variable of this section (its name less the prefix) and the field it sets."""
        return {
            field.validation_alias: name
            for name, field in cls.model_fields.items()
            if isinstance(field.validation_alias, str)
        }

    @classmethod
    def keyed_by_variable(cls, values: Any) -> dict[str, Any]:
        """``values`` (a section, or a mapping by field or variable names) with one key per
        field: its variable where it has one, so that later values by variable replace it."""
        if isinstance(values, Section):
            values = values.model_dump()
        if not isinstance(values, dict):
            return {}
        names = {field: alias for alias, field in cls.variables().items()}
        return {names.get(key, key): value for key, value in values.items()}


def _env(name: str, default: Any, **bounds: Any) -> Any:
    """A section's field read from ``SWITCHYARD_<NAME>``."""
    return Field(default=default, validation_alias=name, **bounds)


class HttpGuardSettings(Section):
    """Client-side limits (``server/http_guard.py``): the request line and headers must arrive
    within ``header_timeout_s`` and fit ``max_header_bytes``; the body within
    ``body_timeout_s``."""

    header_timeout_s: float = _env("header_timeout_s", 10.0, gt=0, le=600)
    max_header_bytes: int = _env("max_header_bytes", 64 * 1024, ge=1024, le=16 * 1024 * 1024)
    body_timeout_s: float = _env("body_timeout_s", 30.0, gt=0, le=3600)


class UpstreamSettings(Section):
    """What every HTTP upstream shares (``providers/http_upstream.py``): connect, per-read
    (between bytes) and whole-request limits in seconds (a provider's own may only be shorter),
    the connection pool per provider (unless its ``max_concurrency`` says otherwise), and how
    much of an answer is read before a 502 (nothing past the cap is buffered). 64 MiB holds the
    largest legitimate answers: ten base64 images, or a 2048-input embedding batch in base64
    (the SDKs' default). An SSE event of a chat stream is a few KiB; 1 MiB leaves room for big
    tool-call or logprob chunks."""

    connect_timeout_s: float = _env("upstream_connect_timeout_s", 5.0, gt=0, le=600)
    read_timeout_s: float = _env("upstream_read_timeout_s", 60.0, gt=0, le=3600)
    total_timeout_s: float = _env("upstream_total_timeout_s", 600.0, gt=0, le=86400)
    pool_size: int = _env("upstream_pool_size", 512, ge=1, le=100_000)
    max_body_bytes: int = _env("upstream_max_body_bytes", 64 * 1024 * 1024, ge=1024, le=4 * 1024**3)
    max_event_bytes: int = _env("upstream_max_event_bytes", 1024 * 1024, ge=1024, le=256 * 1024**2)


class RetrySettings(Section):
    """Tries per candidate (retries on connect errors, timeouts, 429 and 5xx), with exponential
    backoff from initial to max plus jitter (an upstream Retry-After is waited exactly, unless
    longer than ``max_retry_after_s``), and the time budget of all tries and fallbacks of one
    request (``routing/dispatch.py``)."""

    max_tries_per_candidate: int = _env("upstream_max_tries", 3, ge=1, le=10)
    initial_backoff_s: float = _env("upstream_backoff_initial_s", 0.25, ge=0, le=60)
    max_backoff_s: float = _env("upstream_backoff_max_s", 4.0, ge=0, le=600)
    jitter_s: float = _env("upstream_backoff_jitter_s", 0.25, ge=0, le=60)
    max_retry_after_s: float = _env("upstream_max_retry_after_s", 10.0, ge=0, le=3600)
    # Retries and backoff of the whole plan stop here.
    total_budget_s: float = _env("upstream_retry_budget_s", 30.0, gt=0, le=3600)

    @field_validator("max_backoff_s")
    @classmethod
    def _backoff_max_not_below_initial(cls, value: float, info: ValidationInfo) -> float:
        initial = info.data.get("initial_backoff_s")
        if initial is not None and value < initial:
            raise ValueError(f"must be at least {ENV_PREFIX}UPSTREAM_BACKOFF_INITIAL_S ({initial})")
        return value


class BreakerSettings(Section):
    """The circuit breaker per provider/model (``routing/breaker.py``): it opens after
    ``consecutive_failures``, or at ``failure_ratio`` over the last ``window`` calls (judged
    once ``min_calls`` are in), and probes again after ``cooldown_s``."""

    consecutive_failures: int = _env("breaker_consecutive_failures", 5, ge=1, le=10_000)
    failure_ratio: float = _env("breaker_failure_ratio", 0.5, gt=0, le=1)
    window: int = _env("breaker_window", 20, ge=1, le=10_000)
    min_calls: int = _env("breaker_min_calls", 10, ge=1, le=10_000)
    cooldown_s: float = _env("breaker_cooldown_s", 30.0, gt=0, le=86400)

    @field_validator("min_calls")
    @classmethod
    def _min_calls_fit_the_window(cls, value: int, info: ValidationInfo) -> int:
        window = info.data.get("window")
        if window is not None and value > window:
            raise ValueError(f"must not exceed {ENV_PREFIX}BREAKER_WINDOW ({window})")
        return value


class LimiterSettings(Section):
    """The limits gate (``metering/gate.py``): the output estimate of a request without
    ``max_tokens``, and what a Redis outage means: ``closed`` = 503; ``open`` = recently
    verified keys are served unlimited (``AuthSettings.fail_open_window_s``)."""

    default_max_tokens: int = _env("default_max_tokens", 256, ge=1, le=1_000_000)
    on_redis_failure: Literal["closed", "open"] = _env("limits_on_redis_failure", "closed")

    @property
    def fail_open(self) -> bool:
        return self.on_redis_failure == "open"


class AuthSettings(Section):
    """How long a verified key is trusted without asking Redis (``access/auth.py``;
    revocation must land within 1 s), and, when the limits fail open, for how long after its
    last verification a key still serves while Redis is down."""

    cache_ttl_s: float = _env("auth_cache_ttl_s", 0.5, ge=0, le=1.0)
    fail_open_window_s: float = _env("fail_open_window_s", 300.0, ge=0, le=86400)


class ThrottleSettings(Section):
    """Failed admin logins and admin bearers per client address (``access/throttle.py``): past
    ``limit`` in ``window_s``, that address gets 429 until the window ends."""

    limit: int = _env("auth_failure_limit", 10, ge=1, le=1_000_000)
    window_s: float = _env("auth_failure_window_s", 300.0, ge=1, le=86400)


class UsageStoreSettings(Section):
    """The SQL store of usage events and the audit log (``gateway/ledger``): empty = embedded
    SQLite at DATA_DIR/usage/usage.sqlite3, ``sqlite:///<path>`` = another file,
    ``postgresql://...`` = one PostgreSQL shared by replicas; the days kept, today included
    (older days are dropped whole)."""

    url: str = _env("usage_store_url", "")
    retention_days: int = _env("usage_retention_days", 400, ge=1, le=36_500)

    @field_validator("url")
    @classmethod
    def _usage_store_url_form(cls, value: str) -> str:
        return check_store_url(value)  # its errors never repeat a password


class ExportSettings(Section):
    """The exporter, Redis buffer -> store (``metering/exporter.py``): events per store insert,
    the pause between polls once caught up, how long an entry read by a replica may sit
    unacknowledged before another takes it over, and how often the store's maintenance
    (partitions, retention) runs. The rest are the exporter's own pace, not configured."""

    batch: int = _env("usage_export_batch", 1000, ge=1, le=10_000)
    interval_s: float = _env("usage_export_interval_s", 0.5, ge=0.01, le=60)
    claim_idle_s: float = _env("usage_export_claim_idle_s", 30.0, ge=0.1, le=86_400)
    maintain_interval_s: float = _env("usage_maintain_interval_s", 3600.0, ge=1, le=86_400)
    stats_interval_s: float = 1.0
    # How often the dead letters in the store are counted for the metric (and after any new).
    dead_letter_interval_s: float = 15.0
    legacy_interval_s: float = 60.0
    stop_timeout_s: float = 5.0


class AlertSettings(Section):
    """Budget alerts (``alerts/deliverer.py``): the webhook they are POSTed to (empty: alerts
    are only logged), the key their HMAC-SHA256 signature is made with, and the retry schedule
    of a failed delivery."""

    webhook_url: str = _env("alert_webhook_url", "")
    webhook_secret: SecretStr | None = _env("alert_webhook_secret", None)
    retry_initial_s: float = _env("alert_retry_initial_s", 1.0, gt=0, le=3600)
    retry_max_s: float = _env("alert_retry_max_s", 300.0, gt=0, le=86400)
    max_attempts: int = _env("alert_max_attempts", 12, ge=1, le=100)
    timeout_s: float = _env("alert_timeout_s", 10.0, gt=0, le=300)
    poll_s: float = 0.5

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url_form(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL, or empty")
        return value

    @field_validator("webhook_secret")
    @classmethod
    def _webhook_signed(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if info.data.get("webhook_url") and (value is None or len(value) < 16):
            raise ValueError("needs at least 16 characters when ALERT_WEBHOOK_URL is set")
        return value

    @property
    def enabled(self) -> bool:
        return bool(self.webhook_url)

    @property
    def secret(self) -> bytes:
        """The signing key's bytes (empty without one)."""
        return self.webhook_secret.get_secret_value().encode() if self.webhook_secret else b""

    def backoff_s(self, tries: int) -> float:
        """How long an entry tried ``tries`` times waits before the next try."""
        return min(self.retry_max_s, self.retry_initial_s * 2 ** max(0, tries - 1))


class BatchSettings(Section):
    """Batches (``gateway/batches``, docs/batches.md): the largest input file, the most
    requests a batch may hold, the lines one replica runs at once, the share of a key's and
    team's RPM and TPM that batch lines may use, the lease a replica holds a line under
    (renewed every third of it while it runs; another replica takes the line over once it
    lapses), how often the runner looks for work, the longest back-off after a 429, and the
    share of the local engine's sequences batch lines may fill (admitted only while it holds no
    interactive request). ``run`` false (RUN_BATCHES): this replica serves the batch API but
    runs no lines. ``native_poll_s`` and ``native_result_bytes``: how often the upstream
    batches of ``batch: native`` providers are polled, and the most of a results file read."""

    max_file_bytes: int = _env("batch_max_file_bytes", 100 * 1024 * 1024, ge=1024, le=2 * 1024**3)
    max_lines: int = _env("batch_max_lines", 50_000, ge=1, le=1_000_000)
    concurrency: int = _env("batch_concurrency", 16, ge=1, le=10_000)
    limit_share: float = _env("batch_limit_share", 0.5, gt=0, le=1)
    lease_s: float = _env("batch_lease_s", 30.0, ge=0.5, le=3600)
    poll_interval_s: float = _env("batch_poll_interval_s", 0.5, ge=0.01, le=60)
    backoff_max_s: float = _env("batch_backoff_max_s", 60.0, ge=0.1, le=3600)
    local_share: float = _env("batch_local_share", 0.5, gt=0, le=1)
    run: bool = _env("run_batches", True)
    # batch: native providers: how often an upstream batch is polled, the most of its results
    # file that is read.
    native_poll_s: float = _env("batch_native_poll_s", 30.0, ge=0.01, le=3600)
    native_result_bytes: int = _env(
        "batch_native_result_bytes", 1024 * 1024 * 1024, ge=1024, le=16 * 1024**3
    )

    @property
    def lease_ms(self) -> int:
        return round(self.lease_s * 1000)


class Settings(BaseSettings):
    """Every setting: the general ones, and one nested section per part that reads a group
    (``settings.retry``, ``settings.breaker``...). The variables are flat, as they always were:
    ``SWITCHYARD_UPSTREAM_MAX_TRIES`` sets ``settings.retry.max_tries_per_candidate``; a keyword
    argument may name a variable (``upstream_max_tries=1``) or a section (``retry=...``)."""

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
    # Weight of the newest sample in the lowest_latency strategy's moving average.
    route_latency_alpha: float = Field(default=0.3, gt=0, le=1)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=1024**3)
    # Multipart uploads (audio, image edits) are streamed through, never buffered, up to this.
    max_upload_bytes: int = Field(default=25 * 1024 * 1024, ge=1024, le=16 * 1024**3)
    redis_timeout_s: float = Field(default=1.0, gt=0, le=60)
    redis_supervise_interval_s: float = Field(default=1.0, gt=0, le=60)
    access_log: bool = True
    # Traces (OTEL_* variables turn them on) carry prompts and completions only when this is set.
    trace_capture_prompts: bool = False
    # SIGTERM drain: readiness off, new requests 503, in-flight ones get this long to finish.
    shutdown_grace_s: float = Field(default=30.0, ge=0, le=3600)
    # Idle keep-alive connections are closed after this long.
    keep_alive_timeout_s: float = Field(default=5.0, gt=0, le=3600)
    # A bearer token /metrics asks for; unset = open (keep the port private then).
    metrics_token: SecretStr | None = None
    # The dashboard's session cookie carries `Secure` (browsers keep sending it to
    # http://localhost and 127.0.0.1, which count as secure contexts); false only for plain
    # http on another address.
    dashboard_cookie_secure: bool = True
    # Peers (IP addresses or CIDR networks, comma-separated) whose X-Forwarded-For and
    # X-Forwarded-Proto are believed; empty: none, the client is the TCP peer.
    trusted_proxies: str = ""
    # A request in flight counts against max_parallel_requests under a lease this long, renewed
    # by its gateway every third of it: a dead gateway's requests stop counting after at most
    # this long.
    inflight_lease_s: float = Field(default=30.0, ge=0.3, le=3600)

    http_guard: HttpGuardSettings = Field(default_factory=HttpGuardSettings)
    upstream: UpstreamSettings = Field(default_factory=UpstreamSettings)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)
    limits: LimiterSettings = Field(default_factory=LimiterSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    throttle: ThrottleSettings = Field(default_factory=ThrottleSettings)
    usage_store: UsageStoreSettings = Field(default_factory=UsageStoreSettings)
    export: ExportSettings = Field(default_factory=ExportSettings)
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    batches: BatchSettings = Field(default_factory=BatchSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        assert isinstance(env_settings, EnvSettingsSource)
        assert isinstance(dotenv_settings, EnvSettingsSource)
        return (
            init_settings,
            _WithSections(settings_cls, env_settings),
            _WithSections(settings_cls, dotenv_settings),
            file_secret_settings,
        )

    @model_validator(mode="before")
    @classmethod
    def _variables_into_sections(cls, data: Any) -> Any:
        """A keyword argument naming a variable (``upstream_max_tries=1``) goes to its section,
        over what the environment said."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for name, section in sections().items():
            given = {alias: data.pop(alias) for alias in section.variables() if alias in data}
            if given:
                data[name] = {**section.keyed_by_variable(data.get(name)), **given}
        return data

    @field_validator("redis_url")
    @classmethod
    def _redis_url_form(cls, value: str) -> str:
        # redis://, rediss://, unix:// or redis+cluster://host:port[,host:port...]; empty = embedded
        check_redis_url(value.strip())
        return value.strip()

    @field_validator("trusted_proxies")
    @classmethod
    def _trusted_proxies_form(cls, value: str) -> str:
        return ",".join(trusted_proxy_list(value))

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


def sections() -> dict[str, type[Section]]:
    """The sections of ``Settings`` by attribute name."""
    found = {}
    for name, field in Settings.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, Section):
            found[name] = field.annotation
    return found


def variables() -> dict[str, tuple[str, ...]]:
    """Every ``SWITCHYARD_*`` variable (less the prefix, lower case) and where it lands in
    ``Settings``: ``("port",)`` or ``("retry", "max_tries_per_candidate")``."""
    found: dict[str, tuple[str, ...]] = {}
    of_sections = sections()
    for name in Settings.model_fields:
        if name in of_sections:
            for alias, field in of_sections[name].variables().items():
                found[alias] = (name, field)
        else:
            found[name] = (name,)
    return found


class _WithSections(PydanticBaseSettingsSource):
    """An environment source (the process's, or a .env file's) that also reads each section's
    flat variables into that section."""

    def __init__(self, settings_cls: type[BaseSettings], source: EnvSettingsSource) -> None:
        super().__init__(settings_cls)
        self.source = source

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.source.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        data = self.source()
        env_vars = self.source.env_vars
        for name, section in sections().items():
            for alias in section.variables():
                data.pop(alias, None)  # a .env file's variables come back as extras too
            found = {
                alias: env_vars[key]
                for alias in section.variables()
                if (key := (ENV_PREFIX + alias).lower()) in env_vars and env_vars[key] is not None
            }
            if found:
                data[name] = {**section.keyed_by_variable(data.get(name)), **found}
        return data


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
            # A section's field is named by its variable (the alias), last in the location.
            field = str(error["loc"][-1]) if error["loc"] else "?"
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
