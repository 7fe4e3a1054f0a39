"""Prefix blocks: alike openings share their leading block hashes, different ones (or models)
do not; only complete blocks, at most ``blocks`` of them; tokens when a tokenizer is known;
the same hashes in every process (no salted ``hash``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.providers.fleet.prefix import PrefixSettings, prefix_hashes, render_prefix

SETTINGS = PrefixSettings()  # 8 blocks of 256 characters, or of 64 tokens
SYSTEM = "You are the support assistant of ACME. Answer briefly and cite the manual. " * 20


def chat(system: str, question: str, model: str = "tiny") -> dict[str, Any]:
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
    }


def shared_run(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    run = 0
    for left, right in zip(a, b, strict=False):
        if left != right:
            break
        run += 1
    return run


def byte_tokens(text: str) -> list[int]:
    """A byte-level tokenizer: one token per UTF-8 byte."""
    return list(text.encode())


def test_a_shared_system_prompt_shares_every_block_it_fills() -> None:
    inside = (len("system:") + len(SYSTEM)) // SETTINGS.block_chars  # blocks within it: 5
    first = prefix_hashes(chat(SYSTEM, "question 0?"), SETTINGS)
    for n in range(1, 50):
        other = prefix_hashes(chat(SYSTEM, f"question {n}?"), SETTINGS)
        assert shared_run(first, other) >= inside == 5


def test_different_openings_and_models_differ_from_the_first_block() -> None:
    systems = [f"Persona {n}. " + SYSTEM for n in range(50)]
    assert len({prefix_hashes(chat(system, "hi"), SETTINGS)[0] for system in systems}) == 50
    same = prefix_hashes(chat(SYSTEM, "hi"), SETTINGS)
    assert shared_run(same, prefix_hashes(chat(SYSTEM, "hi", model="other"), SETTINGS)) == 0


def test_a_prompt_shorter_than_a_block_is_one_block_whole() -> None:
    one, two = (prefix_hashes(chat("Be terse.", q), SETTINGS) for q in ("one", "two"))
    assert len(one) == len(two) == 1 and one != two


def test_only_complete_blocks_and_at_most_blocks_of_them() -> None:
    limit = SETTINGS.blocks * SETTINGS.block_chars
    long_system = SYSTEM * 3
    assert len(render_prefix(chat(long_system, "q"), 10_000)) > limit
    full = prefix_hashes(chat(long_system, "q"), SETTINGS)
    assert len(full) == SETTINGS.blocks
    late = long_system[: limit + 50] + "DIFFERENT" + long_system[limit + 59 :]
    assert prefix_hashes(chat(late, "q"), SETTINGS) == full
    # A change in the 4th block (characters 768..1023 of the rendered text) keeps 3 blocks.
    early = long_system[:800] + "DIFFERENT" + long_system[809:]
    assert shared_run(prefix_hashes(chat(early, "q"), SETTINGS), full) == 3
    # 600 characters rendered: two complete blocks; the tail of the last is not hashed.
    short = prefix_hashes({"model": "m", "prompt": "x" * 600}, SETTINGS)
    assert short == prefix_hashes({"model": "m", "prompt": "x" * 512 + "y" * 88}, SETTINGS)
    assert len(short) == 2


def test_in_tokens_blocks_follow_the_tokenizer() -> None:
    body = chat("s" * 300, "q")  # rendered: "system:" + 300 s + ... = ~316 bytes = 4 blocks
    hashes = prefix_hashes(body, SETTINGS, byte_tokens)
    assert len(hashes) == 316 // SETTINGS.block_tokens == 4
    # A byte changed in the third block of 64 tokens keeps the first two.
    changed = chat("s" * 130 + "X" + "s" * 169, "q")
    assert shared_run(prefix_hashes(changed, SETTINGS, byte_tokens), hashes) == 2
    # Tokens and characters hash differently: a fleet keeps to one mode.
    assert prefix_hashes(body, SETTINGS)[0] != hashes[0]


def test_content_parts_and_completion_prompts() -> None:
    parts = {
        "model": "m",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
        ],
    }
    as_text = {"model": "m", "messages": [{"role": "system", "content": SYSTEM}]}
    assert shared_run(prefix_hashes(parts, SETTINGS), prefix_hashes(as_text, SETTINGS)) == 5
    prompt = {"model": "m", "prompt": SYSTEM + "tail one"}
    listed = {"model": "m", "prompt": [SYSTEM + "other tail", "second prompt"]}
    assert prefix_hashes(prompt, SETTINGS) == prefix_hashes(listed, SETTINGS)
    ids = {"model": "m", "prompt": list(range(600))}
    assert prefix_hashes(ids, SETTINGS) == prefix_hashes(
        {**ids, "prompt": list(range(601))}, SETTINGS
    )
    # Nothing to read still gives one block (the model's), never an error.
    assert len(prefix_hashes({"model": "m", "messages": "oops"}, SETTINGS)) == 1


def test_every_process_computes_the_same_hashes() -> None:
    body = {"model": "tiny", "messages": [{"role": "system", "content": SYSTEM}]}
    code = (
        "from gateway.providers.fleet.prefix import PrefixSettings, prefix_hashes\n"
        f"print(list(prefix_hashes({body!r}, PrefixSettings())))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(list(prefix_hashes(body, SETTINGS)))


def test_settings_name_the_bad_field() -> None:
    with pytest.raises(ValueError, match="block_chars"):
        PrefixSettings(block_chars=0)
