"""Azure OpenAI: one deployment per model, ``api-version`` on every URL, the ``api-key`` header.

A call for upstream model ``m`` goes to ``{base_url}/openai/deployments/{d}{path}?api-version=
{v}``, where ``d`` is ``deployments[m]`` from the policy (``m`` itself when unmapped, as Azure
deployments are often named after their model) and ``v`` the provider's ``api_version``. The
wire format is OpenAI's Chat Completions (Azure's leading ``prompt_filter_results`` chunk is
skipped by the format's stream parser); Azure's ``content_filter`` errors are recognised, so a
task's ``fallback_on: [content_filter]`` can act on them. Operations Azure does not serve per
deployment (moderations, the Responses API) are refused so the dispatcher moves on.
"""

from __future__ import annotations

from urllib.parse import quote

from gateway.policy import AZURE_DEFAULT_API_VERSION, ProviderConfig
from gateway.providers.http_provider import HttpProvider
from gateway.settings import UpstreamSettings

# The operations an Azure OpenAI deployment serves.
DEPLOYMENT_PATHS = frozenset(
    {
        "/chat/completions",
        "/completions",
        "/embeddings",
        "/images/generations",
        "/images/edits",
        "/audio/transcriptions",
        "/audio/translations",
        "/audio/speech",
    }
)


class AzureOpenAIProvider(HttpProvider):
    def __init__(self, name: str, config: ProviderConfig, upstream: UpstreamSettings) -> None:
        super().__init__(name, config, upstream)
        self.api_version = config.api_version or AZURE_DEFAULT_API_VERSION
        self.deployments = dict(config.deployments)

    def serves(self, path: str) -> bool:
        return path in DEPLOYMENT_PATHS

    def deployment(self, model: str) -> str:
        return self.deployments.get(model, model)

    def url(self, base_url: str, path: str, model: str) -> str:
        deployment = quote(self.deployment(model), safe="")
        version = quote(self.api_version, safe="")
        return f"{base_url}/openai/deployments/{deployment}{path}?api-version={version}"

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"api-key": api_key} if api_key else {}
