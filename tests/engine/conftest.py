"""Tiny random-weight checkpoints and HF transformers reference outputs, shared per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from engine_helpers import INIT_STD, MAX_NEW_TOKENS, make_prompts  # noqa: E402
from tiny_checkpoint import write_tiny_checkpoint  # noqa: E402

from engine.tokenizer import Tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in made:
            root = tmp_path_factory.mktemp(f"tiny-{arch}")
            made[arch] = write_tiny_checkpoint(root / arch, arch=arch, seed=1, init_std=INIT_STD)
        return made[arch]

    return get


@pytest.fixture(scope="session")
def hf_reference(checkpoints: Callable[[str], Path]) -> Callable[[str], tuple[list, list]]:
    """(prompts, greedy continuations) from HF transformers `generate`, one prompt at a time."""
    cache: dict[str, tuple[list, list]] = {}

    def get(arch: str) -> tuple[list, list]:
        if arch not in cache:
            from transformers import AutoModelForCausalLM

            path = checkpoints(arch)
            prompts = make_prompts(Tokenizer(path))
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            outputs = []
            with torch.inference_mode():
                for prompt in prompts:
                    ids = torch.tensor([prompt])
                    out = model.generate(
                        ids,
                        attention_mask=torch.ones_like(ids),
                        max_new_tokens=MAX_NEW_TOKENS,
                        do_sample=False,
                    )
                    outputs.append(out[0, len(prompt) :].tolist())
            cache[arch] = (prompts, outputs)
        return cache[arch]

    return get


@pytest.fixture(scope="session")
def llama_path(checkpoints: Callable[[str], Path]) -> Path:
    return checkpoints("llama")
