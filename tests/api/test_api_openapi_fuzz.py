"""schemathesis fuzzes every operation of ``/openapi.json`` against a real gateway (real Redis,
loopback upstream behind the policy, valid credentials so requests reach the handlers: the
admin key for /admin, an API key for /v1), with data that fits the document and data that
breaks it: no 5xx, every status, content type and body is one the document declares, and every
body, query or header that breaks the document is refused with a 4xx.

In ``make test`` the cases are the same every run (derandomized). ``make fuzz`` sets
``SWITCHYARD_FUZZ_SEED`` to a fresh seed and prints it; ``make fuzz SEED=...`` replays one."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fake_upstream import ThreadedFakeUpstream
from gateway_runner import GatewayThread
from hypothesis import HealthCheck, given, seed, settings
from hypothesis.errors import Unsatisfiable
from marked_gateway import ADMIN_KEY, PROVIDER_KEY, marked_settings, write_policy
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.config import SchemathesisConfig

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
NEGATIVE_CHECKS = [*CHECKS, negative_data_rejection]
# The ways this API refuses a request; 413 too (schemathesis leaves it out by default).
REJECTIONS = ["400", "401", "403", "404", "405", "409", "413", "429"]
CONFIG = SchemathesisConfig.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": REJECTIONS}}}
)
# About 31 operations x 2 modes x this many examples: ~30-60 s on 2 shared cores.
EXAMPLES = int(os.environ.get("SWITCHYARD_FUZZ_EXAMPLES", "50"))
SEED = os.environ.get("SWITCHYARD_FUZZ_SEED")
# Operations that take no input at all (no parameter, body or credentials): nothing to break.
NO_INPUT = {"GET /healthz", "GET /readyz", "GET /metrics", "GET /openapi.json"}


@pytest.fixture(scope="module")
def fuzzed_gateway(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[dict[str, Any]]:
    directory: Path = tmp_path_factory.mktemp("fuzz")
    with pytest.MonkeyPatch.context() as env, ThreadedFakeUpstream() as upstream:
        env.setenv("OPS_TEST_PROVIDER_KEY", PROVIDER_KEY)
        policy = write_policy(directory, upstream.base_url)
        gateway_settings = marked_settings(directory / "data", policy, redis_url)
        with GatewayThread(gateway_settings, guarded=True) as gateway:
            _, key = gateway.create_key(name="fuzz")
            # A second key for the key endpoints to update, rotate and revoke.
            key_id, _ = gateway.create_key(name="fuzz-target")
            yield {"gateway": gateway, "key": key, "key_id": key_id}


MODEL_FOR = {
    "/v1/chat/completions": "fake-model",
    "/v1/completions": "fake-model",
    "/v1/embeddings": "embed-model",
    "/v1/images/generations": "image-model",
    "/v1/messages": "fake-model",
    "/v1/messages/count_tokens": "fake-model",
    "/v1/responses": "fake-model",
    "/v1/moderations": "fake-model",
    "/v1/audio/speech": "fake-model",
}


def steer(case: Any, target: dict[str, Any], turn: int, mode: GenerationMode) -> None:
    """Every other case names a real key, and every other valid case a real model, so the
    fuzzer also reaches the success paths (routing, the upstream, key updates) and not only
    the 404s. A negative case keeps its body: fixing its model could make it valid."""
    if turn % 2:
        return
    body = case.body
    if (
        mode is GenerationMode.POSITIVE
        and isinstance(body, dict)
        and isinstance(body.get("model"), str)
        and case.path in MODEL_FOR
    ):
        body["model"] = MODEL_FOR[case.path]
    if "key_id" in (case.path_parameters or {}):
        case.path_parameters["key_id"] = target["key_id"]


def _fuzz_settings(test: Any) -> Any:
    configured = settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=SEED is None,  # in make test: the same cases every run
        suppress_health_check=list(HealthCheck),
    )(test)
    return seed(int(SEED))(configured) if SEED is not None else configured


def fuzz_test(operation: Any, mode: GenerationMode, target: dict[str, Any], turns: Any) -> Any:
    """One Hypothesis test: ``operation``'s cases of ``mode``, sent and checked."""
    base_url = target["gateway"].base_url
    checks = NEGATIVE_CHECKS if mode is GenerationMode.NEGATIVE else CHECKS

    @given(case=operation.as_strategy(generation_mode=mode))
    @_fuzz_settings
    def fuzz(case: Any) -> None:
        steer(case, target, next(turns), mode)
        token = ADMIN_KEY if case.path.startswith("/admin") else target["key"]
        headers = {"Authorization": f"Bearer {token}"}
        if mode is GenerationMode.NEGATIVE and "Authorization" not in (case.headers or {}):
            headers = {}  # the credentials are what this case leaves out: expect a 401
        case.call_and_validate(base_url=base_url, headers=headers, checks=checks, timeout=10)

    return fuzz


def test_every_operation_conforms(fuzzed_gateway: dict[str, Any]) -> None:
    if SEED is not None:
        print(f"\nfuzzing with seed {SEED}: reproduce with make fuzz SEED={SEED}")
    base_url = fuzzed_gateway["gateway"].base_url
    api = schemathesis.openapi.from_url(base_url + "/openapi.json", config=CONFIG)
    failures: dict[str, str] = {}
    turns = itertools.count()
    tried: list[str] = []
    nothing_to_negate: set[str] = set()
    for result in api.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            label = f"{operation.label} ({mode.value})"
            tried.append(label)
            try:
                fuzz_test(operation, mode, fuzzed_gateway, turns)()
            except Unsatisfiable as exc:
                if mode is GenerationMode.NEGATIVE:
                    nothing_to_negate.add(operation.label)
                else:
                    failures[label] = str(exc)[:3000]
            except (Exception, BaseExceptionGroup) as exc:  # one report for all operations
                failures[label] = str(exc)[:3000]
    assert len(tried) >= 2 * 31, tried
    assert nothing_to_negate <= NO_INPUT, nothing_to_negate
    assert not failures, "\n\n".join(f"{label}:\n{text}" for label, text in failures.items())
