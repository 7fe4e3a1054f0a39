"""Every rendered Kubernetes object validates against the official schemas (strict: unknown
fields are errors) for the oldest and newest Kubernetes we support; KEDA's ScaledObject, a
CRD, against the schema in schemas/ written from KEDA's documented spec."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from .manifests import K8S_DIR, KUBERNETES_VERSIONS, OVERLAYS, Manifest, find, load_yaml

jsonschema = pytest.importorskip("jsonschema", reason="pip install kubernetes-validate")
kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="pip install kubernetes-validate (ships schemas offline)"
)

KEDA_SCHEMA = json.loads(
    (Path(__file__).parent / "schemas/keda-scaledobject.schema.json").read_text()
)
CRD_API_GROUPS = {"keda.sh"}


def validate_builtin(obj: Manifest, version: str) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


def validate_scaled_object(obj: Manifest) -> None:
    jsonschema.Draft202012Validator(KEDA_SCHEMA).validate(obj)
    behavior = obj["spec"].get("advanced", {}).get("horizontalPodAutoscalerConfig", {})
    if "behavior" in behavior:
        # KEDA hands this block to the HPA it creates: check it with the HPA schema.
        hpa = {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": obj["metadata"]["name"]},
            "spec": {
                "scaleTargetRef": obj["spec"]["scaleTargetRef"],
                "maxReplicas": obj["spec"].get("maxReplicaCount", 100),
                "behavior": behavior["behavior"],
            },
        }
        for version in KUBERNETES_VERSIONS:
            validate_builtin(hpa, version)


def validate_any(obj: Manifest) -> None:
    group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
    if group in CRD_API_GROUPS:
        assert obj["kind"] == "ScaledObject", f"no schema for {obj['apiVersion']} {obj['kind']}"
        validate_scaled_object(obj)
        return
    for version in KUBERNETES_VERSIONS:
        validate_builtin(obj, version)


@pytest.mark.parametrize("overlay", ("base", *OVERLAYS))
def test_every_rendered_object_is_valid(rendered: dict[str, list[Manifest]], overlay: str) -> None:
    objects = rendered[overlay]
    assert objects, f"{overlay} rendered nothing"
    for obj in objects:
        validate_any(obj)


def test_secret_template_is_valid() -> None:
    validate_any(load_yaml(K8S_DIR / "secret.example.yaml"))


def test_validators_reject_mistakes(rendered: dict[str, list[Manifest]]) -> None:
    """The checks above can fail: a misspelt field, a wrong type and a broken CRD are caught."""
    gateway = copy.deepcopy(find(rendered["base"], "Deployment", "switchyard-gateway")[0])
    gateway["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_any(gateway)

    hpa = copy.deepcopy(find(rendered["base"], "HorizontalPodAutoscaler")[0])
    hpa["spec"]["minReplicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_any(hpa)

    scaled = copy.deepcopy(find(rendered["gpu"], "ScaledObject")[0])
    del scaled["spec"]["triggers"][0]["metadata"]["query"]
    with pytest.raises(jsonschema.ValidationError):
        validate_any(scaled)

    scaled = copy.deepcopy(find(rendered["gpu"], "ScaledObject")[0])
    scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"][
        "policies"
    ][0]["type"] = 5
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_any(scaled)
