"""An OpenAI-compatible upstream (OpenAI, vLLM, Together, Groq, Gemini's compatibility layer
...): ``{base_url}{path}`` with ``Authorization: Bearer <key>``, every operation passed on as
it is. Its native chat format is Chat Completions; ``formats: [openai_chat,
openai_responses]`` in the policy says the upstream also serves the Responses API (OpenAI
does), so Responses clients reach it untranslated. The calls themselves are
``HttpProvider``'s (``http_upstream``: pooling, caps, scrubbed errors).
"""

from __future__ import annotations

from gateway.providers.http_provider import HttpProvider


class OpenAICompatProvider(HttpProvider):
    """``HttpProvider`` as it is: OpenAI's URLs, bearer key and error bodies."""
