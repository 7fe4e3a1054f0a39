"""Shared helpers for the engine tests (prompts, block accounting, a CPU LLM factory)."""

from __future__ import annotations

from pathlib import Path

from engine.core.llm_engine import LLM
from engine.tokenizer import Tokenizer

# A larger init std than usual gives clear top-1 margins, so greedy tokens compare exactly.
INIT_STD = 0.5
MAX_NEW_TOKENS = 24

_WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "while",
    "the",
    "cat",
    "sleeps",
    "in",
    "the",
    "warm",
    "sun",
    "and",
    "a",
    "gateway",
    "sends",
    "each",
    "request",
    "to",
    "the",
    "model",
    "that",
    "fits",
    "the",
    "task",
    "and",
    "the",
    "budget",
    "best",
]
SHARED_PREFIX = (
    "You are a helpful assistant. Answer briefly and accurately, and say when you do not know. "
    "Every block holds sixteen tokens; a full block can be shared by every request."
)


def make_prompts(tokenizer: Tokenizer, count: int = 16) -> list[list[int]]:
    """Different lengths (3 to ~70 tokens); every other prompt starts with a shared prefix."""
    prompts = []
    for i in range(count):
        tail = " ".join(_WORDS[(i * 5) % 11 : (i * 5) % 11 + 2 + (i * 7) % 19])
        text = f"{SHARED_PREFIX} {tail} {i}" if i % 2 else f"{tail} {i}"
        prompts.append(tokenizer.encode(text))
    return prompts


def make_llm(path: Path, **settings: object) -> LLM:
    settings.setdefault("device", "cpu")
    return LLM(path, progress=False, **settings)


def assert_all_blocks_free(llm_or_engine: object) -> None:
    engine = getattr(llm_or_engine, "engine", llm_or_engine)
    bm = engine.block_manager  # type: ignore[attr-defined]
    assert bm.num_free_blocks == bm.num_blocks
    assert all(block.ref_count == 0 for block in bm.blocks)
    assert not engine.scheduler.running and not engine.scheduler.waiting  # type: ignore[attr-defined]
    assert not engine.requests  # type: ignore[attr-defined]
