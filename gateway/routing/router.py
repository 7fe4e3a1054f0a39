"""Request + policy + health -> ordered candidates, each with the reason it is there.

Model selection:
- ``model`` absent, empty or ``"auto"`` → task routing. The task comes from the ``X-Task-Type``
  header, else ``metadata.task_type`` in the body, else the policy's ``default_task``.
- any other ``model`` is pinned after alias resolution; its fallbacks follow it.
Canaries then swap a model for its canary target for the users in the canary bucket (the source
model stays right behind it as a fallback), the models that do not serve the door's operation
are dropped (a pinned one is a 404 ``model_not_supported``), and the key's allow-list drops what
the key may not use. Dropped candidates stay in ``RoutePlan.skipped`` with the reason, for
explain.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, NoReturn, NotRequired, TypedDict

from gateway.errors import ECHO_CHARS, InvalidRequest, NotFound, PermissionDenied, echo
from gateway.money import format_usd_short
from gateway.policy import AUTO_MODEL, CachePolicy, Candidate, Policy, TaskConfig, effective_cache
from gateway.policy.store import PolicyStore
from gateway.routing.canary import canary_bucket, in_canary
from gateway.routing.estimate import estimate_prompt_tokens, expected_output_tokens
from gateway.routing.price_view import price_view
from gateway.routing.state import RoutingState

TASK_HEADER = "x-task-type"
REQUEST_ID_HEADER = "x-request-id"


class RouteRow(TypedDict):
    """A candidate of a plan, or one it skipped (``reason`` says why)."""

    model: str
    provider: str
    upstream_model: str
    reason: str
    context_window: NotRequired[int]
    price: NotRequired[dict[str, Any]]


class PlanExplanation(TypedDict):
    """What a plan would do (``RoutePlan.explain``)."""

    task: str | None
    strategy: str
    policy_version: str
    prompt_tokens_estimate: int | None
    fallback_on: list[str]
    candidates: list[RouteRow]
    skipped: list[RouteRow]
    notes: list[str]


@dataclass(frozen=True)
class RoutePlan:
    task: str | None
    strategy: str
    candidates: list[Candidate]
    policy_version: str
    notes: list[str] = field(default_factory=list)
    skipped: list[Candidate] = field(default_factory=list)
    # The snapshot this request routes with, so a reload mid-request changes nothing for it.
    policy: Policy | None = None
    # The prompt's estimated tokens, when a candidate has a context_window to check it against.
    prompt_tokens: int | None = None
    # Upstream error codes that move on to the next candidate (the task's fallback_on).
    fallback_on: frozenset[str] = frozenset()

    def too_long_for(self, candidate: Candidate) -> str | None:
        """Why the prompt cannot fit ``candidate``'s context window (None: it may)."""
        window = candidate.context_window
        if window is None or self.prompt_tokens is None or self.prompt_tokens <= window:
            return None
        return f"prompt ~{self.prompt_tokens} tokens exceeds context_window {window}"

    def cache_policy(self) -> CachePolicy | None:
        """The ``cache:`` block in force: the task's, else the first candidate's model's
        (None: the request is not cached)."""
        policy = self.policy
        if policy is None or not self.candidates:
            return None
        task = policy.tasks.get(self.task) if self.task else None
        model = policy.models.get(self.candidates[0].model)
        return effective_cache(
            task.cache if task is not None else None, model.cache if model is not None else None
        )

    def forwarded_header_names(self) -> list[str]:
        """The client's headers that any candidate's provider passes on (``forward_headers``),
        lower-case and sorted."""
        names: set[str] = set()
        for candidate in self.candidates:
            provider = self.policy.providers.get(candidate.provider) if self.policy else None
            if provider is not None:
                names.update(name.lower() for name in provider.forward_headers)
        return sorted(names)

    def header_value(self, served: Candidate, *, spilled: bool = False) -> str:
        """The ``x-switchyard-route`` header: task, strategy and why this candidate."""
        value = f"task={self.task or '-'}; strategy={self.strategy}; reason={served.reason}"
        return f"{value}; spilled" if spilled or served.spilled else value

    def explain(self) -> PlanExplanation:
        def row(candidate: Candidate) -> RouteRow:
            out: RouteRow = {
                "model": candidate.model,
                "provider": candidate.provider,
                "upstream_model": candidate.upstream_model,
                "reason": candidate.reason,
            }
            if candidate.context_window is not None:
                out["context_window"] = candidate.context_window
            model = self.policy.models.get(candidate.model) if self.policy else None
            if model is not None:  # what it is costed at, and whose price that is
                out["price"] = price_view(model)
            return out

        return {
            "task": self.task,
            "strategy": self.strategy,
            "policy_version": self.policy_version,
            "prompt_tokens_estimate": self.prompt_tokens,
            "fallback_on": sorted(self.fallback_on),
            "candidates": [row(c) for c in self.candidates],
            "skipped": [row(c) for c in self.skipped],
            "notes": list(self.notes),
        }


# Request fields beside the messages that the model reads as prompt (tool and output schemas).
def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        for key, item in headers.items():
            if key.lower() == name:
                return item
    return value


def _unit_draw(seed: str) -> float:
    digest = hashlib.sha256(seed.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class Router:
    def __init__(
        self,
        policies: PolicyStore,
        state: RoutingState | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.policies = policies
        self.state = state
        self._rng = rng or random.Random()

    def plan(
        self,
        *,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        key_id: str,
        allowed_models: frozenset[str] | None,
        operation: str | None = None,
    ) -> RoutePlan:
        """``operation``: what the front door asks of the model (``policy/operations.py``);
        a model that does not serve it is refused when pinned and dropped otherwise. None: not
        checked."""
        loaded = self.policies.current
        policy = loaded.policy
        requested = body.get("model")
        if requested is not None and not isinstance(requested, str):
            raise InvalidRequest("model must be a string", param="model")
        explicit_task = self._explicit_task(policy, body, headers)
        notes: list[str] = []
        skipped: list[Candidate] = []
        if requested and requested != AUTO_MODEL:
            task_name = explicit_task  # recorded, but the model is pinned
            strategy = "pinned"
            models = self._pinned(policy, requested)
            pinned: str | None = models[0][0]
            if operation is not None:
                self._check_pinned_serves(policy, requested, pinned, operation)
        else:
            task_name = explicit_task or policy.default_task
            pinned = None
            if task_name is None:
                raise InvalidRequest(
                    "you must provide a model parameter (or a task type: this policy has no "
                    "default_task)",
                    param="model",
                )
            task = policy.tasks[task_name]
            strategy = task.strategy
            models, dropped = self._task_candidates(policy, task, body, headers)
            notes.extend(f"{model} skipped: {why}" for model, why in dropped)
            skipped = [self._candidate(policy, m, f"skipped: {why}") for m, why in dropped]
        models = self._with_fallbacks(policy, models)
        models = self._apply_canaries(policy, models, body, key_id)
        if operation is not None:
            models, unfit = self._serving(policy, models, operation)
            skipped.extend(unfit)
            notes.extend(f"{c.model} {c.reason}" for c in unfit)
            if not models:
                raise InvalidRequest(
                    f"no model of the task `{task_name}` serves {operation}",
                    param="model",
                    code="model_not_supported",
                )
        kept, denied = self._allowed(policy, models, allowed_models)
        skipped.extend(denied)
        pinned_denied = pinned is not None and any(c.model == pinned for c in denied)
        if not kept or pinned_denied:
            # A model the key may not use is refused, not quietly swapped for a fallback.
            self._raise_nothing_allowed(requested, task_name, strategy)
        candidates = [self._candidate(policy, m, why) for m, why in kept]
        windows = any(candidate.context_window is not None for candidate in candidates)
        task_config = policy.tasks.get(task_name) if task_name else None
        return RoutePlan(
            task=task_name,
            strategy=strategy,
            candidates=candidates,
            policy_version=loaded.version,
            notes=notes,
            skipped=skipped,
            policy=policy,
            prompt_tokens=estimate_prompt_tokens(body) if windows else None,
            fallback_on=frozenset(task_config.fallback_on) if task_config else frozenset(),
        )

    # -- choosing -------------------------------------------------------------------------

    def _explicit_task(
        self, policy: Policy, body: Mapping[str, Any], headers: Mapping[str, str]
    ) -> str | None:
        from_header = _header(headers, TASK_HEADER)
        metadata = body.get("metadata")
        from_body = metadata.get("task_type") if isinstance(metadata, dict) else None
        name, param = (
            (from_header, TASK_HEADER) if from_header else (from_body, "metadata.task_type")
        )
        if name:
            if not isinstance(name, str) or name not in policy.tasks:
                known = ", ".join(sorted(policy.tasks)) or "none"
                raise InvalidRequest(
                    f"unknown task type {echo(name)} (known: {known})",
                    param=param,
                    code="unknown_task",
                )
            return name
        return None

    def _pinned(self, policy: Policy, requested: str) -> list[tuple[str, str]]:
        model = policy.resolve_model(requested)
        if model is None:
            shown = requested if len(requested) <= ECHO_CHARS else echo(requested)
            raise NotFound(
                f"The model `{shown}` does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )
        reason = "pinned" if requested == model else f"pinned via alias {requested}"
        return [(model, reason)]

    @staticmethod
    def _check_pinned_serves(policy: Policy, requested: str, model: str, operation: str) -> None:
        """A pinned model that does not serve the door's operation is refused here, as OpenAI
        refuses a model on an endpoint it does not serve (404), never sent upstream."""
        failure = policy.operation_failure(model, operation)
        if failure is not None:
            shown = requested if len(requested) <= ECHO_CHARS else echo(requested)
            raise NotFound(
                f"The model `{shown}` {failure}: this endpoint needs a model that serves "
                f"{operation}.",
                param="model",
                code="model_not_supported",
            )

    def _serving(
        self, policy: Policy, models: list[tuple[str, str]], operation: str
    ) -> tuple[list[tuple[str, str]], list[Candidate]]:
        """The candidates that serve ``operation``; the others, skipped with the reason."""
        kept: list[tuple[str, str]] = []
        unfit: list[Candidate] = []
        for model, reason in models:
            failure = policy.operation_failure(model, operation)
            if failure is None:
                kept.append((model, reason))
            else:
                unfit.append(self._candidate(policy, model, f"skipped: {failure}"))
        return kept, unfit

    def _task_candidates(
        self,
        policy: Policy,
        task: TaskConfig,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
    ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        eligible: list[str] = []
        dropped: list[tuple[str, str]] = []
        for name in task.candidates:
            model = policy.resolve_model(name)
            if model is None or model in eligible:
                continue
            failure = policy.constraint_failure(task, model)
            if failure:
                dropped.append((model, failure))
            else:
                eligible.append(model)
        if task.strategy == "cheapest":
            ordered = self._cheapest(policy, task, eligible, body)
        elif task.strategy == "lowest_latency":
            ordered = self._lowest_latency(eligible)
        elif task.strategy == "weighted":
            ordered = self._weighted(policy, task, eligible, headers)
        else:
            ordered = [(m, f"ordered #{i + 1}") for i, m in enumerate(eligible)]
        for name in task.fallbacks:
            model = policy.resolve_model(name)
            if model is not None:
                ordered.append((model, "task fallback"))
        return ordered, dropped

    def _cheapest(
        self, policy: Policy, task: TaskConfig, models: list[str], body: Mapping[str, Any]
    ) -> list[tuple[str, str]]:
        prompt = estimate_prompt_tokens(body)
        completion = expected_output_tokens(body, task.expected_output_tokens)
        costs = {m: policy.models[m].pricing.cost_nanos(prompt, completion) for m in models}
        ranked = sorted(models, key=lambda m: costs[m])  # stable: ties keep the listed order
        return [(m, f"cheapest: est {format_usd_short(costs[m])}") for m in ranked]

    def _lowest_latency(self, models: list[str]) -> list[tuple[str, str]]:
        latency = self.state.latency if self.state else None
        estimates = {m: latency.estimate(m) if latency else None for m in models}
        # Models never measured go first (listed order) so that each gets a first sample.
        ranked = sorted(models, key=lambda m: (estimates[m] is not None, estimates[m] or 0.0))
        return [
            (
                m,
                f"lowest_latency: ewma {estimates[m] * 1000:.0f} ms"
                if estimates[m] is not None
                else "lowest_latency: no samples yet",
            )
            for m in ranked
        ]

    def _weighted(
        self,
        policy: Policy,
        task: TaskConfig,
        models: list[str],
        headers: Mapping[str, str],
    ) -> list[tuple[str, str]]:
        weights: dict[str, float] = {}
        for name, weight in (task.weights or {}).items():
            model = policy.resolve_model(name)
            if model in models:
                weights[model] = weights.get(model, 0.0) + weight
        pool = [m for m in models if weights.get(m, 0.0) > 0]
        total = sum(weights[m] for m in pool)
        if not pool or total <= 0:
            return [(m, "weighted: no weight left, listed order") for m in models]
        # Deterministic per request id (a retried request lands on the same model), else random.
        request_id = _header(headers, REQUEST_ID_HEADER)
        draw = _unit_draw(request_id) if request_id else self._rng.random()
        point = draw * total
        chosen = pool[-1]
        for model in pool:
            point -= weights[model]
            if point < 0:
                chosen = model
                break
        rest = sorted((m for m in models if m != chosen), key=lambda m: -weights.get(m, 0.0))
        share = weights[chosen] / total * 100
        return [(chosen, f"weighted {share:.0f}% (draw {draw:.3f})")] + [
            (m, f"weighted fallback ({weights.get(m, 0.0) / total * 100:.0f}%)") for m in rest
        ]

    # -- shaping the list ------------------------------------------------------------------

    def _with_fallbacks(
        self, policy: Policy, models: list[tuple[str, str]]
    ) -> list[tuple[str, str]]:
        """Dedupe, then append each model's fallbacks (transitively) in order."""
        result: list[tuple[str, str]] = []
        seen: set[str] = set()

        def add(model: str, reason: str) -> None:
            if model in seen:
                return
            seen.add(model)
            result.append((model, reason))

        for model, reason in models:
            add(model, reason)
        index = 0
        while index < len(result):
            source = result[index][0]
            for fallback in policy.model_fallbacks(source):
                add(fallback, f"fallback of {source}")
            index += 1
        return result

    def _apply_canaries(
        self,
        policy: Policy,
        models: list[tuple[str, str]],
        body: Mapping[str, Any],
        key_id: str,
    ) -> list[tuple[str, str]]:
        if not policy.canaries:
            return models
        user = body.get("user")
        subject = user if isinstance(user, str) and user else key_id
        result: list[tuple[str, str]] = []
        for model, reason in models:
            canary = policy.canary_for(model)
            if canary is None:
                result.append((model, reason))
                continue
            target = policy.resolve_model(canary.target) or model
            bucket = canary_bucket(model, subject)
            label = f"canary {canary.percent:g}% bucket {bucket / 100:.2f}"
            if in_canary(bucket, canary.percent):
                result.append((target, f"{label} ({reason})"))
                result.append((model, f"canary source, after {target}"))
            else:
                result.append((model, f"{reason}; {label}: control"))
        deduped: list[tuple[str, str]] = []
        seen: set[str] = set()
        for model, reason in result:
            if model not in seen:
                seen.add(model)
                deduped.append((model, reason))
        return deduped

    def _allowed(
        self,
        policy: Policy,
        models: list[tuple[str, str]],
        allowed_models: frozenset[str] | None,
    ) -> tuple[list[tuple[str, str]], list[Candidate]]:
        if allowed_models is None:
            return models, []
        allowed = _AllowList(policy, allowed_models)
        kept: list[tuple[str, str]] = []
        denied: list[Candidate] = []
        for model, reason in models:
            if allowed.permits(model):
                kept.append((model, reason))
            else:
                denied.append(self._candidate(policy, model, "skipped: not allowed for this key"))
        return kept, denied

    def _raise_nothing_allowed(
        self, requested: str | None, task: str | None, strategy: str
    ) -> NoReturn:
        if strategy == "pinned":
            raise PermissionDenied(
                f"this key may not use the model `{requested}`",
                param="model",
                code="model_not_allowed",
            )
        raise PermissionDenied(
            f"this key may not use any model of the task `{task}`",
            param="model",
            code="model_not_allowed",
        )

    @staticmethod
    def _candidate(policy: Policy, model: str, reason: str) -> Candidate:
        config = policy.models[model]
        return Candidate(
            model,
            config.provider,
            policy.upstream_model(model),
            reason,
            context_window=config.context_window,
        )


class _AllowList:
    """A key's allowed models: model names, aliases of them, or glob patterns (``gpt-4.1*``)."""

    def __init__(self, policy: Policy, entries: Iterable[str]) -> None:
        self.names: set[str] = set()
        self.patterns: list[str] = []
        for entry in entries:
            if any(ch in entry for ch in "*?["):
                self.patterns.append(entry)
            else:
                self.names.add(policy.resolve_model(entry) or entry)

    def permits(self, model: str) -> bool:
        return model in self.names or any(fnmatchcase(model, p) for p in self.patterns)
