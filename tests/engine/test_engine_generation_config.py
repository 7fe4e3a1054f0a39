"""The checkpoint's recommended sampling (generation_config.json), read as vLLM reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from engine.errors import ConfigError
from engine.generation_config import sampling_defaults


def checkpoint(tmp_path: Path, **config: object) -> Path:
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    return tmp_path


def test_auto_reads_the_sampling_fields_and_nothing_else(tmp_path: Path) -> None:
    folder = checkpoint(
        tmp_path,
        bos_token_id=1,
        eos_token_id=[2, 3],
        do_sample=True,
        temperature=0.6,
        top_p=0.95,
        top_k=20,
        repetition_penalty=1.1,
        max_new_tokens=300,
    )
    assert sampling_defaults("auto", folder) == {
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "repetition_penalty": 1.1,
        "max_tokens": 300,
    }


def test_vllm_ignores_the_file_and_no_file_means_no_defaults(tmp_path: Path) -> None:
    folder = checkpoint(tmp_path, temperature=0.6)
    assert sampling_defaults("vllm", folder) == {}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert sampling_defaults("auto", empty) == {}


def test_a_directory_mode_reads_that_directorys_file(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    checkpoint(other, temperature=0.3)
    model = tmp_path / "model"
    model.mkdir()
    assert sampling_defaults(str(other), model) == {"temperature": 0.3}


def test_the_override_goes_over_the_file(tmp_path: Path) -> None:
    folder = checkpoint(tmp_path, temperature=0.6, top_p=0.95)
    got = sampling_defaults("auto", folder, {"temperature": 0.2, "max_new_tokens": 64})
    assert got == {"temperature": 0.2, "top_p": 0.95, "max_tokens": 64}


def test_bad_values_fail_at_load_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="top_p"):
        sampling_defaults("auto", checkpoint(tmp_path, top_p=1.5))
    with pytest.raises(ConfigError, match="unknown field 'temp'"):
        sampling_defaults("vllm", tmp_path, {"temp": 0.2})
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"generation_config\.json"):
        sampling_defaults("auto", tmp_path)


def test_the_offline_api_uses_the_checkpoints_defaults(tmp_path: Path) -> None:
    from tiny_checkpoint import write_tiny_checkpoint

    from engine.core.llm_engine import LLM

    folder = write_tiny_checkpoint(tmp_path / "tiny", arch="qwen3")
    config_file = folder / "generation_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "temperature": 0.0, "max_new_tokens": 3}))
    llm = LLM(folder, progress=False, device="cpu", kv_cache_bytes=16 * 1024 * 1024)
    params = llm.default_sampling_params()
    assert (params.temperature, params.max_tokens) == (0.0, 3)
    assert llm.engine.sampling_defaults == {"temperature": 0.0, "max_tokens": 3}
    (out,) = llm.generate(["Hello there"])
    assert 1 <= len(out.token_ids) <= 3
