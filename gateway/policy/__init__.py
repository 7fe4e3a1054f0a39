"""The routing policy (``routing_rules.yaml``): its schema, one file per section, and reading it.

The bottom of the gateway's configuration: every part that reads the policy (routing, the
providers, metering, access, the cache, the admin API) imports it from here, and nothing here
imports those parts. ``store.PolicyStore`` holds the policy in force (hot reload, admin edits);
``merge`` applies a JSON edit to the YAML file; ``bounded_yaml`` is the parser that refuses a
document built to keep it busy. The JSON Schema in ``docs/policy.schema.json`` is generated from
these classes: ``python -m gateway.policy --schema``.
"""

from gateway.policy.base import PolicyError, StrictModel
from gateway.policy.cache import CachePolicy, effective_cache
from gateway.policy.candidate import Candidate
from gateway.policy.document import AUTO_MODEL, Canary, Policy
from gateway.policy.engine import LocalEngineSettings, SpillWhen
from gateway.policy.fleet import FleetConfig, FleetPrefix, FleetScrape
from gateway.policy.models import ModelConfig, ModelDefaults, Price
from gateway.policy.parse import (
    MAX_POLICY_ALIASES,
    MAX_POLICY_BYTES,
    MAX_POLICY_DEPTH,
    MAX_POLICY_NODES,
    load_policy_file,
    parse_policy,
    policy_json_schema,
    policy_version,
    validate_policy_data,
)
from gateway.policy.providers import (
    ANTHROPIC_DEFAULT_VERSION,
    AZURE_DEFAULT_API_VERSION,
    NATIVE_FORMATS,
    ChatFormat,
    ProviderConfig,
    ProviderKind,
    never_forwarded,
)
from gateway.policy.tasks import Strategy, TaskConfig

__all__ = [
    "ANTHROPIC_DEFAULT_VERSION",
    "AUTO_MODEL",
    "AZURE_DEFAULT_API_VERSION",
    "MAX_POLICY_ALIASES",
    "MAX_POLICY_BYTES",
    "MAX_POLICY_DEPTH",
    "MAX_POLICY_NODES",
    "NATIVE_FORMATS",
    "CachePolicy",
    "Canary",
    "Candidate",
    "ChatFormat",
    "FleetConfig",
    "FleetPrefix",
    "FleetScrape",
    "LocalEngineSettings",
    "ModelConfig",
    "ModelDefaults",
    "Policy",
    "PolicyError",
    "Price",
    "ProviderConfig",
    "ProviderKind",
    "SpillWhen",
    "Strategy",
    "StrictModel",
    "TaskConfig",
    "effective_cache",
    "load_policy_file",
    "never_forwarded",
    "parse_policy",
    "policy_json_schema",
    "policy_version",
    "validate_policy_data",
]
