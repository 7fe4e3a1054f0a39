"""The engine's public surface: what the gateway (and anyone else) imports, from here only.

Offline: ``LLM(model).generate(prompts, SamplingParams(...))``. Online: ``AsyncEngine(config)``,
``start()``, then ``async for output in engine.generate(request_id, prompt, params)``.

Each name is imported on first use (PEP 562 ``__getattr__``), so that ``import engine`` and the
torch-free names (the errors, ``SamplingParams``, ``StructuredOutput``, the bundled model's
path) do not load torch: a gateway without the engine extra starts fine when no local model
is configured.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.core.async_engine import AsyncEngine
    from engine.core.llm_engine import LLM, CompletionOutput, LLMEngine, RequestOutput
    from engine.core.request_state import StreamOutput
    from engine.errors import (
        ConfigError,
        EngineDeadError,
        EngineNotRunningError,
        EngineStepError,
        GrammarError,
        InvalidPromptError,
        LoaderError,
        RequestTooLargeError,
        SamplingParamsError,
        TokenizerError,
        UnsupportedModelError,
        WeightShapeError,
    )
    from engine.gguf.bundled import BUNDLED_SAMPLING, find_bundled_model
    from engine.gguf.convert import is_prepared, prepare_gguf, view_dir
    from engine.sampling import SamplingParams
    from engine.structured.spec import StructuredOutput
    from engine.tokenizer import Tokenizer

__all__ = [
    "BUNDLED_SAMPLING",
    "LLM",
    "AsyncEngine",
    "CompletionOutput",
    "ConfigError",
    "EngineConfig",
    "EngineDeadError",
    "EngineNotRunningError",
    "EngineStepError",
    "GrammarError",
    "InvalidPromptError",
    "LLMEngine",
    "LoaderError",
    "RequestOutput",
    "RequestTooLargeError",
    "SamplingParams",
    "SamplingParamsError",
    "StreamOutput",
    "StructuredOutput",
    "Tokenizer",
    "TokenizerError",
    "UnsupportedModelError",
    "WeightShapeError",
    "find_bundled_model",
    "is_prepared",
    "prepare_gguf",
    "view_dir",
]

# Where each public name is defined.
_HOMES = {
    "LLM": "engine.core.llm_engine",
    "LLMEngine": "engine.core.llm_engine",
    "RequestOutput": "engine.core.llm_engine",
    "CompletionOutput": "engine.core.llm_engine",
    "AsyncEngine": "engine.core.async_engine",
    "StreamOutput": "engine.core.request_state",
    "EngineConfig": "engine.config",
    "SamplingParams": "engine.sampling",
    "StructuredOutput": "engine.structured.spec",
    "Tokenizer": "engine.tokenizer",
    "BUNDLED_SAMPLING": "engine.gguf.bundled",
    "find_bundled_model": "engine.gguf.bundled",
    "is_prepared": "engine.gguf.convert",
    "prepare_gguf": "engine.gguf.convert",
    "view_dir": "engine.gguf.convert",
    **{
        name: "engine.errors"
        for name in (
            "ConfigError",
            "EngineDeadError",
            "EngineNotRunningError",
            "EngineStepError",
            "GrammarError",
            "InvalidPromptError",
            "LoaderError",
            "RequestTooLargeError",
            "SamplingParamsError",
            "TokenizerError",
            "UnsupportedModelError",
            "WeightShapeError",
        )
    },
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
