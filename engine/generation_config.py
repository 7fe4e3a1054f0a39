"""A checkpoint's recommended sampling settings, applied where a request sets none (vLLM's
``--generation-config auto``, its default).

``generation_config.json`` beside the weights may carry ``temperature``, ``top_p``, ``top_k``,
``min_p``, ``repetition_penalty`` and ``max_new_tokens``: those become the defaults of every
request that leaves them out (``max_new_tokens`` as the default ``max_tokens``), the same
fields vLLM reads. ``generation_config: vllm`` ignores the file (the engine's own defaults,
temperature 1); a directory path reads that directory's file instead.
``override_generation_config`` goes over whatever the file says (how the bundled GGUF, which
has no such settings, gets its model card's recommendation). A value the sampler would refuse
is a ``ConfigError`` at load, naming the file: not a 400 on every request later.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine.errors import ConfigError, SamplingParamsError
from engine.sampling import SamplingParams

# generation_config.json's names -> SamplingParams' (the ones vLLM takes from the file)
FILE_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}
GENERATION_CONFIG_FILE = "generation_config.json"


def _read_file(directory: Path) -> dict[str, Any]:
    file = directory / GENERATION_CONFIG_FILE
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {file}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{file} is not a JSON object")
    return {FILE_FIELDS[name]: value for name, value in data.items() if name in FILE_FIELDS}


def sampling_defaults(
    mode: str, model_dir: Path, override: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """SamplingParams field -> default for requests that do not set it (may be empty)."""
    if mode == "auto":
        values = _read_file(model_dir)
    elif mode == "vllm":
        values = {}
    else:
        values = _read_file(Path(mode).expanduser())
    for name, value in (override or {}).items():
        if name not in FILE_FIELDS:
            known = ", ".join(FILE_FIELDS)
            raise ConfigError(
                f"override_generation_config: unknown field {name!r} (known: {known})"
            )
        values[FILE_FIELDS[name]] = value
    try:
        SamplingParams(**values)
    except (SamplingParamsError, TypeError) as exc:
        raise ConfigError(f"generation config of {model_dir}: {exc}") from None
    return values
