"""The whole policy: its sections, and the references between them checked (models name
providers, aliases and tasks name models, fallbacks have no cycle, canaries...)."""

from __future__ import annotations

from pydantic import Field, ValidationError, model_validator

from gateway.ledger.record import label_problem
from gateway.policy.base import PolicyError, StrictModel
from gateway.policy.models import ModelConfig
from gateway.policy.operations import declared_operations, serves
from gateway.policy.providers import NATIVE_BATCH_KINDS, ProviderConfig
from gateway.policy.tasks import TaskConfig
from gateway.pricing.catalogue import bundled_catalogue

# The model value that asks for task routing instead of naming a model (an absent model too).
AUTO_MODEL = "auto"


class Canary(StrictModel):
    source: str = Field(alias="from")
    target: str = Field(alias="to")
    percent: float = Field(ge=0, le=100)


class Policy(StrictModel):
    providers: dict[str, ProviderConfig]
    models: dict[str, ModelConfig]
    aliases: dict[str, str] = Field(default_factory=dict)
    tasks: dict[str, TaskConfig] = Field(default_factory=dict)
    default_task: str | None = None
    fallbacks: dict[str, list[str]] = Field(
        default_factory=dict, description="model -> models tried after it fails"
    )
    canaries: list[Canary] = Field(default_factory=list)

    @model_validator(mode="after")
    def _references(self) -> Policy:
        self._check_local_providers()
        self._check_native_batches()
        for name, model in self.models.items():
            if model.provider not in self.providers:
                raise PolicyError(f"models.{name}.provider", f"unknown provider {model.provider!r}")
        if AUTO_MODEL in self.models or AUTO_MODEL in self.aliases:
            raise PolicyError("models", f"{AUTO_MODEL!r} is reserved for task routing")
        for alias, target in self.aliases.items():
            if alias in self.models:
                raise PolicyError(f"aliases.{alias}", "an alias may not shadow a model name")
            if target not in self.models:
                raise PolicyError(f"aliases.{alias}", f"points to unknown model {target!r}")
        for task_name, task in self.tasks.items():
            self._check_task(f"tasks.{task_name}", task)
        if self.default_task is not None and self.default_task not in self.tasks:
            raise PolicyError("default_task", f"unknown task {self.default_task!r}")
        for source, targets in self.fallbacks.items():
            self._require_model(f"fallbacks.{source}", source)
            for index, target in enumerate(targets):
                self._require_model(f"fallbacks.{source}.{index}", target)
        self._check_fallback_cycles()
        seen_sources: set[str] = set()
        for index, canary in enumerate(self.canaries):
            path = f"canaries.{index}"
            source = self._require_model(f"{path}.from", canary.source)
            target = self._require_model(f"{path}.to", canary.target)
            if source == target:
                raise PolicyError(f"{path}.to", "a canary must go to a different model")
            if source in seen_sources:
                raise PolicyError(f"{path}.from", f"{source!r} already has a canary")
            seen_sources.add(source)
        return self

    @model_validator(mode="after")
    def _catalogue_prices(self) -> Policy:
        """Models without a ``price:`` take the price catalogue's (gateway/pricing); the
        local engine and engine fleets are never priced from it."""
        for name, config in self.models.items():
            provider = self.providers[config.provider]
            if "price" in config.model_fields_set or provider.kind in ("local", "engine_fleet"):
                continue
            api_url = provider.url if provider.kind == "openai_compatible" else None
            found = bundled_catalogue().lookup(provider.kind, api_url, self.upstream_model(name))
            if found is not None:
                config.set_catalogue_price(found)
        return self

    @model_validator(mode="after")
    def _ledger_labels(self) -> Policy:
        """Provider, model, alias and task names are recorded with every usage event: each
        must pass the ledger's label rule, or every request through it would lose its usage."""
        for section in ("providers", "models", "aliases", "tasks"):
            for name in getattr(self, section):
                problem = label_problem(name)
                if problem is not None:
                    raise PolicyError(f"{section}.{name!r}", f"the name {problem}")
        return self

    def _check_local_providers(self) -> None:
        local = [name for name, p in self.providers.items() if p.kind == "local"]
        if len(local) > 1:
            raise PolicyError(
                f"providers.{local[1]}",
                f"only one local provider is allowed (one engine per process; {local[0]} is one)",
            )
        for name in local:
            try:
                self.providers[name].engine_settings  # noqa: B018 (validates)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(part) for part in first["loc"])
                path = f"providers.{name}.engine" + (f".{where}" if where else "")
                raise PolicyError(path, first["msg"].removeprefix("Value error, ")) from None

    def _check_native_batches(self) -> None:
        for name, provider in self.providers.items():
            if provider.batch == "native" and provider.kind not in NATIVE_BATCH_KINDS:
                raise PolicyError(
                    f"providers.{name}.batch",
                    f"batch: native applies only to {' and '.join(NATIVE_BATCH_KINDS)} "
                    f"providers (this one is {provider.kind}); leave it gateway",
                )

    def _require_model(self, path: str, name: str) -> str:
        resolved = self.resolve_model(name)
        if resolved is None:
            raise PolicyError(path, f"unknown model or alias {name!r}")
        return resolved

    def _check_task(self, path: str, task: TaskConfig) -> None:
        resolved = [
            self._require_model(f"{path}.candidates.{i}", name)
            for i, name in enumerate(task.candidates)
        ]
        for i, name in enumerate(task.fallbacks):
            self._require_model(f"{path}.fallbacks.{i}", name)
        if task.strategy == "weighted":
            if not task.weights:
                raise PolicyError(f"{path}.weights", "the weighted strategy needs weights")
            for name, weight in task.weights.items():
                if name not in task.candidates:
                    raise PolicyError(f"{path}.weights.{name}", "not one of the task's candidates")
                if weight < 0:
                    raise PolicyError(f"{path}.weights.{name}", "a weight may not be negative")
            if sum(task.weights.values()) <= 0:
                raise PolicyError(f"{path}.weights", "at least one weight must be positive")
        elif task.weights is not None:
            raise PolicyError(f"{path}.weights", f"weights do not apply to {task.strategy!r}")
        eligible = [name for name in resolved if not self.constraint_failure(task, name)]
        if not eligible:
            raise PolicyError(
                f"{path}.candidates", "no candidate meets max_price_per_mtok/require_capabilities"
            )

    def _check_fallback_cycles(self) -> None:
        graph = {
            self.resolve_model(source): [self.resolve_model(t) for t in targets]
            for source, targets in self.fallbacks.items()
        }
        done: set[str] = set()

        def visit(node: str, trail: list[str]) -> None:
            if node in trail:
                cycle = " -> ".join([*trail[trail.index(node) :], node])
                raise PolicyError(f"fallbacks.{trail[0]}", f"fallback cycle: {cycle}")
            if node in done:
                return
            for nxt in graph.get(node, []):
                visit(nxt, [*trail, node])
            done.add(node)

        for source in graph:
            visit(source, [])

    def resolve_model(self, name: str) -> str | None:
        """Model name after alias resolution, or None when neither exists."""
        if name in self.models:
            return name
        return self.aliases.get(name)

    def upstream_model(self, name: str) -> str:
        return self.models[name].upstream_model or name

    def model_fallbacks(self, name: str) -> list[str]:
        """Resolved fallback models of ``name``, in order (direct ones only)."""
        targets = self.fallbacks.get(name)
        if targets is None:
            # Fallbacks may be declared under an alias of the model.
            for key, value in self.fallbacks.items():
                if self.resolve_model(key) == name:
                    targets = value
                    break
        return [resolved for t in targets or [] if (resolved := self.resolve_model(t))]

    def constraint_failure(self, task: TaskConfig, model: str) -> str | None:
        """Why ``model`` breaks the task's constraints, or None when it meets them."""
        config = self.models[model]
        limit = task.max_price_per_mtok
        highest = config.pricing.highest_per_mtok
        if limit is not None and highest > limit:
            return f"price ${highest}/Mtok over max ${limit}/Mtok"
        missing = [c for c in task.require_capabilities if c not in config.capabilities]
        if missing:
            return f"lacks capabilities {', '.join(missing)}"
        return None

    def operation_failure(self, model: str, operation: str) -> str | None:
        """Why ``model`` may not be sent ``operation`` (its capabilities name other operations
        only), or None when it may (``policy/operations.py``)."""
        capabilities = self.models[model].capabilities
        if serves(capabilities, operation):
            return None
        named = ", ".join(sorted(declared_operations(capabilities)))
        return f"does not serve {operation} (its operations: {named})"

    def canary_for(self, model: str) -> Canary | None:
        for canary in self.canaries:
            if self.resolve_model(canary.source) == model:
                return canary
        return None
