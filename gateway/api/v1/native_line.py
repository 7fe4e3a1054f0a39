"""A batch's lines for a provider's own batch API, and the pipeline: the ``NativeLines`` the
batch runner is given (``gateway/batches/native/lines.py``).

``route`` takes a line in as the pipeline would (``batch_line.checked_line``: the batch's key,
no stream, its tags, its body checked at the door), plans it (``V1Pipeline.plan``: tasks,
aliases, the key's models), and keeps it native only when the plan's first candidate is a
``batch: native`` provider that speaks the line's own format (so its body goes as it is, the
model replaced); it then holds the line's worst case against the key's budgets
(``LimitsGate.reserve`` with ``hold_ms``: the same worst case and the same refusal as the
pipeline's reservation, but no RPM, TPM or in-flight slot). Anything the pipeline would refuse
stays with the pipeline, which answers it as it answers any line.

``record`` ends a line's provider result as a request through ``V1Pipeline.serve``: the
books of a request of the batch's key (its tags and the batch's, priced at the batch price,
its budget hold settled, a usage event with the provider's own token counts, under an id of
the line's so a result recorded twice is one event), answered as the pipeline answers
(``V1Pipeline.answered``) or refused with the provider's error as the pipeline relays one.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from gateway.access.keys import KeyRecord
from gateway.api.v1.batch_line import DOORS, checked_line, line_attribution, line_request
from gateway.api.v1.doors import Door
from gateway.api.v1.pipeline import V1Pipeline
from gateway.api.v1.request_end import Call, Reply
from gateway.batches.lines import LineCall, LineResult
from gateway.batches.native.anthropic import AnthropicBatches
from gateway.batches.native.lines import NativeOutcome, NativeRoute
from gateway.batches.native.openai import OpenAiBatches
from gateway.batches.native.upstream import BatchApi
from gateway.errors import GatewayError, InvalidRequest, ServiceUnavailable
from gateway.formats.errors import FormatError
from gateway.formats.translation import Translation
from gateway.metering.accounting import Accounting
from gateway.metering.attribution import Attribution, batch_tag
from gateway.policy import Candidate, Policy, ProviderConfig
from gateway.policy.providers import NATIVE_BATCH_KINDS
from gateway.providers.attempt import Answer, sampling_defaults
from gateway.providers.base import broken_answer
from gateway.providers.http_provider import HttpProvider
from gateway.routing.dispatch import AttemptRecord, DispatchResult
from gateway.routing.router import RoutePlan

ROUTE_REASON = "batch: native"


def _native(config: ProviderConfig | None) -> bool:
    return config is not None and config.batch == "native" and config.kind in NATIVE_BATCH_KINDS


class PipelineNativeLines:
    def __init__(self, pipeline: V1Pipeline, *, result_cap: int) -> None:
        self.pipeline = pipeline
        self.result_cap = result_cap

    def native_providers(self) -> frozenset[str]:
        policy = self.pipeline.policies.policy_or_none()
        if policy is None:
            return frozenset()
        return frozenset(name for name, config in policy.providers.items() if _native(config))

    def _http(self, policy: Policy, name: str) -> HttpProvider | None:
        """The provider the pipeline sends ``name``'s requests through, when it is native."""
        config = policy.providers.get(name)
        if config is None or not _native(config):
            return None
        provider = self.pipeline.providers.get(name, config)
        return provider if isinstance(provider, HttpProvider) else None

    async def route(self, line: LineCall, *, hold_id: str, hold_ms: int) -> NativeRoute | None:
        pipeline, door = self.pipeline, DOORS[line.endpoint]
        try:
            principal = await pipeline.auth.principal_of(line.key_id)
            checked = checked_line(door, line, principal, {})
            books = Accounting(route=door.route, started=time.perf_counter())
            plan, policy = pipeline.plan(books, checked.raw, principal, door, {})
            first = plan.candidates[0]
            provider = self._http(policy, first.provider)
            if provider is None:
                return None
            target = checked.translation.target(provider.formats, provider.door_paths)
            if target != door.format:
                return None  # a cross-format route: the pipeline translates it
            hold, _ = await pipeline.gate.reserve(
                principal, plan, checked.raw, policy, hold_id, door.route, hold_ms=hold_ms
            )
        except ServiceUnavailable:
            raise  # no policy, key store or limiter now: the batch is sorted again later
        except GatewayError:
            return None  # the pipeline refuses it as it refuses any line
        return NativeRoute(first.provider, first.model, hold)

    def batch_api(self, provider: str) -> BatchApi | None:
        policy = self.pipeline.policies.policy_or_none()
        http = self._http(policy, provider) if policy is not None else None
        if http is None:
            return None
        if http.config.kind == "anthropic":
            return AnthropicBatches(http, result_cap=self.result_cap)
        return OpenAiBatches(http, result_cap=self.result_cap)

    async def upstream_body(self, line: LineCall, route: NativeRoute) -> dict[str, Any] | None:
        pipeline, door = self.pipeline, DOORS[line.endpoint]
        policy = pipeline.policies.policy_or_none()
        model = policy.models.get(route.model) if policy is not None else None
        if policy is None or model is None or model.provider != route.provider:
            return None
        config = policy.providers[route.provider]
        if not _native(config):
            return None
        try:
            principal = await pipeline.auth.principal_of(line.key_id)
            translation = checked_line(door, line, principal, {}).translation
            _, body = translation.upstream_body(
                door.format,
                policy.upstream_model(route.model),
                stream=False,
                default_max_tokens=config.default_max_tokens,
                defaults=sampling_defaults(policy, route.model),
            )
        except ServiceUnavailable:
            raise  # the key store away: submitted at the next poll
        except (GatewayError, FormatError):
            return None  # the pipeline answers it now (a revoked key: its 401)
        return body

    async def record(self, line: LineCall, outcome: NativeOutcome) -> LineResult:
        pipeline, door = self.pipeline, DOORS[line.endpoint]
        policy = pipeline.policies.policy_or_none()
        if policy is None:  # no prices to book it at: the runner records it later
            raise ServiceUnavailable("no routing policy is loaded", code="policy_not_loaded")

        async def answering(pipeline: V1Pipeline, call: Call, door: Door) -> Reply:
            return await self._answer(call, door, line, outcome, policy)

        response = await pipeline.serve(line_request(door, line.request_id), door, answering)
        return LineResult(response.status_code, bytes(response.body))

    async def _answer(
        self, call: Call, door: Door, line: LineCall, outcome: NativeOutcome, policy: Policy
    ) -> Reply:
        """The provider's result as the line's answer, booked as a request of the key."""
        books, route = call.books, outcome.route
        books.record_id = outcome.record_id
        # The provider ran the line: it is booked even if the key was revoked since.
        record = await self.pipeline.auth.keys.get(line.key_id)
        books.key_id, books.team = line.key_id, (record.team if record else None) or ""
        raw = dict(line.body)
        books.plan, books.policy = self._plan(raw, door, line, route, policy), policy
        books.batch, books.reservation = True, route.hold
        books.attribution = _attribution(raw, call, record, line.batch_id)
        if outcome.error is not None:
            raise outcome.error
        try:
            data = orjson.loads(outcome.body)
        except orjson.JSONDecodeError:
            data = None
        try:
            if not isinstance(data, dict):
                raise FormatError("the answer is not a JSON object")
            body, usage = Translation(door.client_side, raw, None).answer(
                door.format, outcome.body, data
            )
        except FormatError as exc:
            raise broken_answer(exc, route.provider) from None
        candidate = books.plan.candidates[0]
        tried = AttemptRecord(candidate.model, candidate.provider, "ok", status=outcome.status)
        result = DispatchResult(Answer(body, usage), candidate, [tried])
        return self.pipeline.answered(call, door, books.plan, result)

    def _plan(
        self, raw: dict[str, Any], door: Door, line: LineCall, route: NativeRoute, policy: Policy
    ) -> RoutePlan:
        """The line's plan as the usage event names it: the model and provider its route
        chose when it was sent, under the task the pipeline would name now."""
        upstream = (
            policy.upstream_model(route.model) if route.model in policy.models else route.model
        )
        candidate = Candidate(route.model, route.provider, upstream, ROUTE_REASON)
        version = self.pipeline.policies.current.version
        try:
            now = self.pipeline.router.plan(
                body=raw, headers={}, key_id=line.key_id, allowed_models=None
            )
            task, strategy, version = now.task, now.strategy, now.policy_version
        except GatewayError:
            task, strategy = None, "pinned"
        return RoutePlan(task, strategy, [candidate], version, policy=policy)


def _attribution(
    raw: dict[str, Any], call: Call, record: KeyRecord | None, batch_id: str
) -> Attribution:
    try:
        tags = record.tags if record is not None else None
        return line_attribution(raw, call.request.headers, tags, batch_id)
    except InvalidRequest:  # the key's tags changed since: the batch's own tag still
        return Attribution(end_user="", tags=(batch_tag(batch_id),))
