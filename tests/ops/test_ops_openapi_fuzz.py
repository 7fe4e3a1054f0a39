"""schemathesis fuzzes every operation of ``/openapi.json`` against a real gateway (real Redis,
loopback upstream behind the policy, valid credentials so requests reach the handlers): no 5xx,
and every status, content type and body is one the document declares."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from ops_support import ADMIN_KEY, PROVIDER_KEY, ThreadGateway, thread_settings, write_policy
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.fake_upstream import ThreadedFakeUpstream

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# About 20 operations x this many examples, ~60 s on 2 shared cores.
EXAMPLES = int(os.environ.get("SWITCHYARD_FUZZ_EXAMPLES", "100"))


@pytest.fixture(scope="module")
def fuzzed_gateway(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[dict[str, Any]]:
    directory: Path = tmp_path_factory.mktemp("fuzz")
    with pytest.MonkeyPatch.context() as env, ThreadedFakeUpstream() as upstream:
        env.setenv("OPS_TEST_PROVIDER_KEY", PROVIDER_KEY)
        policy = write_policy(directory, upstream.base_url)
        gateway_settings = thread_settings(directory / "data", policy, redis_url)
        with ThreadGateway(gateway_settings) as gateway:
            _, key = gateway.create_key(name="fuzz")
            # A second key for the key endpoints to update, rotate and revoke.
            key_id, _ = gateway.create_key(name="fuzz-target")
            yield {"gateway": gateway, "key": key, "key_id": key_id}


MODEL_FOR = {
    "/v1/chat/completions": "fake-model",
    "/v1/completions": "fake-model",
    "/v1/embeddings": "embed-model",
    "/v1/images/generations": "image-model",
}


def steer(case: Any, target: dict[str, Any], turn: int) -> None:
    """Every other case names a real model and a real key, so the fuzzer also reaches the
    success paths (routing, the upstream, key updates) and not only the 404s."""
    if turn % 2:
        return
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("model"), str) and case.path in MODEL_FOR:
        body["model"] = MODEL_FOR[case.path]
    if "key_id" in (case.path_parameters or {}):
        case.path_parameters["key_id"] = target["key_id"]


def test_every_operation_conforms(fuzzed_gateway: dict[str, Any]) -> None:
    base_url = fuzzed_gateway["gateway"].base_url
    api = schemathesis.openapi.from_url(base_url + "/openapi.json")
    failures: dict[str, str] = {}
    turns = itertools.count()
    tried: list[str] = []
    for result in api.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,  # the same cases every run: a failure reproduces
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case: Any) -> None:
            steer(case, fuzzed_gateway, next(turns))
            token = ADMIN_KEY if case.path.startswith("/admin") else fuzzed_gateway["key"]
            headers = {"Authorization": f"Bearer {token}"}
            case.call_and_validate(base_url=base_url, headers=headers, checks=CHECKS, timeout=10)

        tried.append(operation.label)
        try:
            fuzz()
        except Exception as exc:  # one report for all operations
            failures[operation.label] = str(exc)[:3000]
    assert len(tried) >= 19, tried
    assert not failures, "\n\n".join(f"{label}:\n{text}" for label, text in failures.items())
