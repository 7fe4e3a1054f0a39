"""What the rendered overlays must mean beyond schema validity: probes on the right endpoints,
graceful shutdown, non-root, a hot-reloadable policy mount, references that resolve, Redis
with AOF, and GPU engines that KEDA scales and the gateways route to."""

from __future__ import annotations

import dataclasses
import posixpath
from urllib.parse import urlsplit

import pytest

from gateway.policy import Policy, parse_policy
from gateway.settings import load_settings

from .manifests import (
    GPU_OVERLAYS,
    IN_CLUSTER_REDIS_OVERLAYS,
    K8S_DIR,
    OVERLAYS,
    Manifest,
    container,
    env_values,
    find,
    load_yaml,
    mount_at,
    one,
    pod_labels,
    pod_spec,
    selects,
    volume_for_mount,
    workloads,
)

GATEWAY = "switchyard-gateway"
ENGINE = "switchyard-engine"
HEADLESS = "switchyard-engine-headless"
ALWAYS_NEEDED_SECRETS = {"SWITCHYARD_ADMIN_KEY", "SWITCHYARD_KEY_PEPPER"}
# Not yet a field of EngineConfig: tensor parallelism lands with engine/distributed.py.
PENDING_ENGINE_SETTINGS = {"tensor_parallel_size"}

Renders = dict[str, list[Manifest]]


def switchyard_workloads(objects: list[Manifest]) -> list[Manifest]:
    return [w for w in workloads(objects) if w["metadata"]["name"] in (GATEWAY, ENGINE)]


def mounted_policy(objects: list[Manifest], workload: Manifest) -> tuple[Manifest, Policy]:
    """The ConfigMap behind SWITCHYARD_POLICY_FILE, and the policy it holds, parsed by the
    gateway's own loader."""
    policy_file = env_values(container(workload))["SWITCHYARD_POLICY_FILE"]
    _mount, volume = volume_for_mount(workload, posixpath.dirname(policy_file))
    assert "configMap" in volume, "the policy comes from a ConfigMap"
    config_map = one(objects, "ConfigMap", volume["configMap"]["name"])
    text = config_map["data"][posixpath.basename(policy_file)]
    return config_map, parse_policy(text)


def check_engine_settings(settings: dict) -> None:
    """The engine's own config class accepts the settings (names and values)."""
    engine_config = pytest.importorskip("engine.config", reason="needs the engine extra (torch)")
    fields = {f.name for f in dataclasses.fields(engine_config.EngineConfig)}
    unknown = set(settings) - fields - PENDING_ENGINE_SETTINGS
    assert not unknown, f"EngineConfig has no {sorted(unknown)}"
    engine_config.EngineConfig(**{k: v for k, v in settings.items() if k in fields})


def needed_secret_keys(policy: Policy) -> set[str]:
    return ALWAYS_NEEDED_SECRETS | {
        p.api_key_env for p in policy.providers.values() if p.api_key_env
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_switchyard_pods_probe_drain_and_run_unprivileged(rendered: Renders, overlay: str) -> None:
    for workload in switchyard_workloads(rendered[overlay]):
        name = workload["metadata"]["name"]
        spec, main = pod_spec(workload), container(workload)
        ports = {p["name"]: p["containerPort"] for p in main["ports"]}
        env = env_values(main)
        assert env["SWITCHYARD_HOST"] == "0.0.0.0", f"{name}: must listen on all interfaces"
        assert int(env["SWITCHYARD_PORT"]) == ports["http"]
        assert env["SWITCHYARD_LOG_FORMAT"] == "json"
        assert env["SWITCHYARD_LIMITS_ON_REDIS_FAILURE"] in ("closed", "open")
        assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert main["startupProbe"]["httpGet"]["path"] == "/healthz"
        # The pod keeps serving while endpoints drain, then has time to finish in-flight work.
        sleep_command = main["lifecycle"]["preStop"]["exec"]["command"]
        assert sleep_command[0] == "sleep"
        assert spec["terminationGracePeriodSeconds"] >= int(sleep_command[1]) + 20
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] > 0
        assert spec["automountServiceAccountToken"] is False
        assert main["securityContext"]["allowPrivilegeEscalation"] is False
        assert main["securityContext"]["readOnlyRootFilesystem"] is True
        assert main["securityContext"]["capabilities"]["drop"] == ["ALL"]
        for kind in ("requests", "limits"):
            assert {"memory"} <= set(main["resources"][kind]), f"{name}: {kind} memory"
        assert "cpu" in main["resources"]["requests"]
        # Writable paths the read-only root needs are volumes.
        for path in (env["SWITCHYARD_DATA_DIR"], "/tmp"):
            volume_for_mount(workload, path)
        # An autoscaler owns the replica count; a fixed one would fight it on every apply.
        assert "replicas" not in workload["spec"], f"{name}: replicas set next to an autoscaler"
        image, _, tag = main["image"].rpartition(":")
        assert image == name.replace("-gateway", "") and tag not in ("", "latest")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateways_believe_forwarded_headers_only_from_listed_proxies(
    rendered: Renders, overlay: str
) -> None:
    """Behind the ingress every client would share its address (one client's failed admin
    credentials locking out the rest) unless the gateway knows which peers are proxies."""
    env = env_values(container(one(rendered[overlay], "Deployment", GATEWAY)))
    trusted = env["SWITCHYARD_TRUSTED_PROXIES"]
    assert trusted and "*" not in trusted
    assert load_settings(_env_file=None, trusted_proxies=trusted).trusted_proxies == trusted


@pytest.mark.parametrize("overlay", ("base", *OVERLAYS))
def test_policy_is_mounted_as_a_hot_reloadable_directory(rendered: Renders, overlay: str) -> None:
    objects = rendered[overlay]
    for workload in switchyard_workloads(objects):
        policy_file = env_values(container(workload))["SWITCHYARD_POLICY_FILE"]
        mount, _volume = volume_for_mount(workload, posixpath.dirname(policy_file))
        assert "subPath" not in mount, "a subPath mount never sees ConfigMap updates"
        assert mount["readOnly"] is True
        config_map, policy = mounted_policy(objects, workload)
        assert policy.providers and policy.models
        if workload["metadata"]["name"] == GATEWAY:
            # Updated in place (hot reload), not renamed per edit (which would roll the pods).
            assert config_map["metadata"]["name"] == "switchyard-policy"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_references_resolve(rendered: Renders, overlay: str) -> None:
    objects = rendered[overlay]
    names = {(obj["kind"], obj["metadata"]["name"]) for obj in objects}
    namespaces = {obj["metadata"].get("namespace") for obj in objects if obj["kind"] != "Namespace"}
    assert namespaces == {one(objects, "Namespace", namespaces.copy().pop())["metadata"]["name"]}
    external_secret = load_yaml(K8S_DIR / "secret.example.yaml")
    for workload in workloads(objects):
        spec = pod_spec(workload)
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in names
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                assert ("PersistentVolumeClaim", claim) in names
        for source in container(workload).get("envFrom", []):
            secret_name = source["secretRef"]["name"]
            if ("Secret", secret_name) in names:
                secret_keys = set(one(objects, "Secret", secret_name)["data"])
            else:
                # Production overlays expect the operator's Secret, shaped like the template.
                assert secret_name == external_secret["metadata"]["name"], secret_name
                secret_keys = set(external_secret["stringData"])
            if workload["metadata"]["name"] in (GATEWAY, ENGINE):
                _cm, policy = mounted_policy(objects, workload)
                missing = needed_secret_keys(policy) - secret_keys
                assert not missing, f"{overlay}: secret lacks {sorted(missing)}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_hpa_and_pdb_select_the_right_pods(rendered: Renders, overlay: str) -> None:
    objects = rendered[overlay]
    for service in find(objects, "Service"):
        selector = service["spec"]["selector"]
        targets = [w for w in workloads(objects) if selects(selector, pod_labels(w))]
        assert len(targets) == 1, f"Service {service['metadata']['name']} selects {len(targets)}"
        port_names = {p["name"] for p in container(targets[0])["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names
    hpa = one(objects, "HorizontalPodAutoscaler", GATEWAY)
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": GATEWAY,
    }
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    gateway = one(objects, "Deployment", GATEWAY)
    budget = one(objects, "PodDisruptionBudget", GATEWAY)
    assert selects(budget["spec"]["selector"]["matchLabels"], pod_labels(gateway))
    # A budget that can never be met at the minimum size would block every node drain.
    if "minAvailable" in budget["spec"]:
        assert budget["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]


@pytest.mark.parametrize("overlay", IN_CLUSTER_REDIS_OVERLAYS)
def test_redis_is_durable_and_reachable_only_by_switchyard(rendered: Renders, overlay: str) -> None:
    objects = rendered[overlay]
    redis = one(objects, "StatefulSet", "switchyard-redis")
    args = container(redis)["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    data_dir = args[args.index("--dir") + 1]
    claims = {t["metadata"]["name"] for t in redis["spec"]["volumeClaimTemplates"]}
    assert mount_at(redis, data_dir)["name"] in claims
    governing = one(objects, "Service", redis["spec"]["serviceName"])
    assert governing["spec"]["clusterIP"] == "None"
    policy = one(objects, "NetworkPolicy", "switchyard-redis")
    assert selects(policy["spec"]["podSelector"]["matchLabels"], pod_labels(redis))
    allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    for workload in switchyard_workloads(objects):
        url = urlsplit(env_values(container(workload))["SWITCHYARD_REDIS_URL"])
        service = one(objects, "Service", url.hostname)
        assert url.port in {p["port"] for p in service["spec"]["ports"]}
        assert selects(service["spec"]["selector"], pod_labels(redis))
        assert selects(allowed, pod_labels(workload)), f"NetworkPolicy blocks {workload}"


@pytest.mark.parametrize("overlay", GPU_OVERLAYS)
def test_engine_gpus_match_tensor_parallelism(rendered: Renders, overlay: str) -> None:
    objects = rendered[overlay]
    engine = one(objects, "Deployment", ENGINE)
    _cm, policy = mounted_policy(objects, engine)
    local = [p for p in policy.providers.values() if p.kind == "local"]
    assert len(local) == 1, "an engine replica serves exactly one local provider"
    settings = local[0].engine or {}
    check_engine_settings(settings)
    assert settings["device"] == "cuda"
    resources = container(engine)["resources"]
    gpus = settings["tensor_parallel_size"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == gpus
    _mount, shm = volume_for_mount(engine, "/dev/shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    model_dir = settings["model"]
    if model_dir.startswith("/"):
        mount, volume = volume_for_mount(engine, "/" + model_dir.strip("/").split("/")[0])
        assert mount["readOnly"] is True and "persistentVolumeClaim" in volume
    tolerations = pod_spec(engine)["tolerations"]
    assert any(t["key"] == "nvidia.com/gpu" for t in tolerations)


@pytest.mark.parametrize("overlay", GPU_OVERLAYS)
def test_keda_scales_the_engine_on_its_queue(rendered: Renders, overlay: str) -> None:
    objects = rendered[overlay]
    engine = one(objects, "Deployment", ENGINE)
    scaled = one(objects, "ScaledObject", ENGINE)
    assert scaled["spec"]["scaleTargetRef"]["name"] == ENGINE
    assert scaled["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    assert 1 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]
    assert not find(objects, "HorizontalPodAutoscaler", ENGINE), "KEDA makes the engine's HPA"
    queries = [t["metadata"]["query"] for t in scaled["spec"]["triggers"]]
    assert any(q.startswith("sum(num_requests_waiting{") for q in queries)
    namespace = engine["metadata"]["namespace"]
    app = pod_labels(engine)["app.kubernetes.io/name"]
    annotations = engine["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    for query in queries:
        # Label matchers must name this overlay's namespace and the engine pods, or KEDA
        # scales on an empty series.
        assert f'namespace="{namespace}"' in query
        assert f'app_kubernetes_io_name="{app}"' in query


@pytest.mark.parametrize("overlay", GPU_OVERLAYS)
def test_gateways_route_over_the_engine_replicas_as_a_fleet(
    rendered: Renders, overlay: str
) -> None:
    objects = rendered[overlay]
    _gw_cm, gateway_policy = mounted_policy(objects, one(objects, "Deployment", GATEWAY))
    engine = one(objects, "Deployment", ENGINE)
    _engine_cm, engine_policy = mounted_policy(objects, engine)
    headless = one(objects, "Service", HEADLESS)
    # One DNS record per ready replica: no cluster IP, not-ready pods left out.
    assert headless["spec"]["clusterIP"] == "None"
    assert not headless["spec"].get("publishNotReadyAddresses", False)
    assert selects(headless["spec"]["selector"], pod_labels(engine))
    fleets = [
        name
        for name, provider in gateway_policy.providers.items()
        if provider.kind == "engine_fleet"
        and provider.fleet is not None
        and provider.fleet.dns is not None
        and urlsplit(provider.fleet.dns).hostname == headless["metadata"]["name"]
    ]
    assert len(fleets) == 1, "one gateway provider routes over the engine replicas"
    provider = gateway_policy.providers[fleets[0]]
    assert provider.fleet is not None and provider.fleet.dns is not None
    url = urlsplit(provider.fleet.dns)
    assert url.scheme == "http"
    # The port the Service names is the pods' own: a headless name resolves to pod addresses.
    container_ports = {p["name"]: p["containerPort"] for p in container(engine)["ports"]}
    service_ports = {p["port"]: p["targetPort"] for p in headless["spec"]["ports"]}
    assert url.port in service_ports and container_ports[service_ports[url.port]] == url.port
    # The fleet reads the replicas' queue from the same /metrics Prometheus scrapes for KEDA.
    annotations = engine["spec"]["template"]["metadata"]["annotations"]
    assert provider.fleet.scrape.metrics_path == annotations["prometheus.io/path"]
    assert provider.fleet.refresh_s <= 10, "scaled replicas must be found within seconds"
    routed = [m for m, cfg in gateway_policy.models.items() if cfg.provider == fleets[0]]
    assert routed, "no gateway model is served by the engine"
    for model in routed:
        assert engine_policy.resolve_model(gateway_policy.upstream_model(model)) is not None, model
    used_by_tasks = {c for task in gateway_policy.tasks.values() for c in task.candidates}
    assert used_by_tasks & set(routed), "no task routes to the engine"


def test_external_redis_overlay_takes_the_url_from_the_secret(rendered: Renders) -> None:
    objects = rendered["external-redis"]
    assert not find(objects, "StatefulSet") and not find(objects, "NetworkPolicy")
    assert not [s for s in find(objects, "Service") if "redis" in s["metadata"]["name"]]
    gateway = container(one(objects, "Deployment", GATEWAY))
    assert all(e["name"] != "SWITCHYARD_REDIS_URL" for e in gateway["env"])
    secret_names = {source["secretRef"]["name"] for source in gateway["envFrom"]}
    template = load_yaml(K8S_DIR / "secret.example.yaml")
    assert template["metadata"]["name"] in secret_names
    assert "SWITCHYARD_REDIS_URL" in template["stringData"]
    assert "SWITCHYARD_USAGE_STORE_URL" in template["stringData"]  # replicas share one store


def test_dev_overlay_is_self_contained(rendered: Renders) -> None:
    objects = rendered["dev"]
    assert not find(objects, "Deployment", ENGINE)
    secret = find(objects, "Secret")
    assert len(secret) == 1 and secret[0]["metadata"]["name"].startswith("switchyard-secrets-")
