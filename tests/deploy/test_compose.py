"""docker compose: the file validates against the Compose Specification schema (the copy that
PyPI's check-jsonschema ships) and wires two gateways, a durable Redis, one PostgreSQL usage store and Prometheus together.
`docker compose config` is not run: this machine's docker CLI has no compose plugin."""

from __future__ import annotations

import json
import posixpath
import re
from importlib import resources
from urllib.parse import urlsplit

import pytest

from gateway.policy import load_policy_file

from .manifests import DEPLOY_DIR, REPO_ROOT, load_yaml, read_env_file

jsonschema = pytest.importorskip("jsonschema", reason="pip install check-jsonschema")

COMPOSE_FILE = DEPLOY_DIR / "docker-compose.yaml"
GATEWAYS = ("gateway-1", "gateway-2")


@pytest.fixture(scope="module")
def compose() -> dict:
    return load_yaml(COMPOSE_FILE)


def compose_schema() -> dict:
    try:
        vendored = resources.files("check_jsonschema.builtin_schemas.vendor")
    except ModuleNotFoundError:
        pytest.skip("pip install check-jsonschema (ships the Compose Specification schema)")
    return json.loads((vendored / "compose-spec.json").read_text())


def test_compose_file_matches_the_compose_spec(compose: dict) -> None:
    validator = jsonschema.Draft202012Validator(compose_schema())
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(compose)]
    assert not errors, errors
    broken = {**compose, "services": {"redis": {"image": "redis", "healthcheck": {"tset": []}}}}
    assert list(validator.iter_errors(broken)), "the schema must reject a misspelt key"


def test_redis_keeps_an_append_only_file_on_a_volume(compose: dict) -> None:
    redis = compose["services"]["redis"]
    command = redis["command"]
    assert command[0] == "redis-server"
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    volume, _, target = redis["volumes"][0].partition(":")
    assert target == "/data" and volume in compose["volumes"]
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_both_replicas_share_one_postgresql_usage_store_on_a_volume(compose: dict) -> None:
    postgres = compose["services"]["postgres"]
    volume, _, target = postgres["volumes"][0].partition(":")
    assert target == "/var/lib/postgresql/data" and volume in compose["volumes"]
    assert postgres["healthcheck"]["test"][1] == "pg_isready"
    env = postgres["environment"]
    urls = {compose["services"][n]["environment"]["SWITCHYARD_USAGE_STORE_URL"] for n in GATEWAYS}
    (url,) = urls  # one store for both
    # Compose fills the password in from deploy/.env, and refuses to start without one.
    password = re.compile(r"\$\{POSTGRES_PASSWORD:\?[^}]+\}")
    assert password.fullmatch(env["POSTGRES_PASSWORD"])
    parsed = urlsplit(password.sub("secret", url))
    assert password.search(url) and parsed.password == "secret"
    assert parsed.scheme == "postgresql" and parsed.hostname == "postgres"
    assert parsed.username == env["POSTGRES_USER"] and parsed.path == "/" + env["POSTGRES_DB"]
    assert "POSTGRES_PASSWORD" in read_env_file(DEPLOY_DIR / ".env.example")
    for name in GATEWAYS:
        depends = compose["services"][name]["depends_on"]
        assert depends["postgres"]["condition"] == "service_healthy"


@pytest.mark.parametrize("name", GATEWAYS)
def test_gateway_replica_wiring(compose: dict, name: str) -> None:
    service = compose["services"][name]
    build = service["build"]
    context = (DEPLOY_DIR / build["context"]).resolve()
    assert context == REPO_ROOT and (context / build["dockerfile"]).is_file()
    env = service["environment"]
    assert env["SWITCHYARD_HOST"] == "0.0.0.0"
    redis_url = urlsplit(env["SWITCHYARD_REDIS_URL"])
    assert redis_url.hostname in compose["services"]
    assert service["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "/healthz" in " ".join(service["healthcheck"]["test"])
    assert service["read_only"] is True and service["cap_drop"] == ["ALL"]
    # The policy directory is mounted read-only at the directory of SWITCHYARD_POLICY_FILE.
    policy_file = env["SWITCHYARD_POLICY_FILE"]
    (mount,) = [v for v in service["volumes"] if v["target"] == posixpath.dirname(policy_file)]
    assert mount["type"] == "bind" and mount["read_only"] is True
    policy = load_policy_file(DEPLOY_DIR / mount["source"] / posixpath.basename(policy_file))
    # Every key the policy names, and the server secrets, come from the env file template.
    assert service["env_file"] == [".env"]
    template = read_env_file(DEPLOY_DIR / ".env.example")
    needed = {"SWITCHYARD_ADMIN_KEY", "SWITCHYARD_KEY_PEPPER"} | {
        p.api_key_env for p in policy.providers.values() if p.api_key_env
    }
    assert needed <= set(template), sorted(needed - set(template))


def test_replicas_publish_distinct_local_ports(compose: dict) -> None:
    published = [compose["services"][name]["ports"][0] for name in GATEWAYS]
    assert len(set(published)) == len(published)
    assert all(port.startswith("127.0.0.1:") and port.endswith(":8080") for port in published)


def test_env_template_holds_no_secrets() -> None:
    template = read_env_file(DEPLOY_DIR / ".env.example")
    assert template and all(value == "" for value in template.values()), template


def test_prometheus_scrapes_both_gateways(compose: dict) -> None:
    prometheus = compose["services"]["prometheus"]
    config_mount = next(v for v in prometheus["volumes"] if v.startswith("./prometheus.yml:"))
    assert config_mount.endswith(":ro")
    config = load_yaml(DEPLOY_DIR / "prometheus.yml")
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "switchyard-gateway"]
    assert job["metrics_path"] == "/metrics"
    targets = {t for group in job["static_configs"] for t in group["targets"]}
    expected = {
        f"{name}:{compose['services'][name]['environment']['SWITCHYARD_PORT']}" for name in GATEWAYS
    }
    assert targets == expected
