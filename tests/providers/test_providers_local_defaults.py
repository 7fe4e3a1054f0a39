"""What a request that sets no sampling gets from the local engine: the checkpoint's
recommendation (generation_config.json, as vLLM's ``--generation-config auto``), the policy's
``defaults:`` of the model over it, and a max_tokens sized for the device (256 on the CPU)
rather than the whole context left. The openai SDK through a real gateway, tiny checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from local_policy import local_policy
from openai import OpenAI

from gateway.providers.local import CPU_DEFAULT_MAX_TOKENS

HI = [{"role": "user", "content": "Hi"}]
UNTIL_LIMIT = {"ignore_eos": True}  # every answer runs to its max_tokens


def client(gateway, key) -> OpenAI:
    return OpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tuned(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint with a generation_config.json that recommends greedy, 6 tokens."""
    folder = tmp_path_factory.mktemp("tuned") / "tiny-qwen3"
    shutil.copytree(checkpoint, folder)
    config_file = folder / "generation_config.json"
    config = json.loads(config_file.read_text())
    config.update(temperature=0.0, max_new_tokens=6)
    config_file.write_text(json.dumps(config))
    return folder


def with_capped_model(policy_text: str) -> str:
    policy = yaml.safe_load(policy_text)
    policy["models"]["tiny-capped"] = {
        "provider": "home",
        "upstream_model": "tiny-qwen3",
        "defaults": {"max_tokens": 3},
    }
    return yaml.safe_dump(policy)


def test_the_checkpoints_recommendation_applies_where_the_request_says_nothing(
    start_gateway, tuned
) -> None:
    policy = with_capped_model(local_policy(tuned, kv_cache_bytes=64 * 1024 * 1024))
    gateway, key = start_gateway(policy)
    oai = client(gateway, key)
    answers = [
        oai.chat.completions.create(model="tiny", messages=HI, seed=seed, extra_body=UNTIL_LIMIT)
        for seed in (1, 2)
    ]
    assert [a.usage.completion_tokens for a in answers] == [6, 6]  # max_new_tokens
    # temperature 0 from the file: the seed changes nothing
    assert answers[0].choices[0].message.content == answers[1].choices[0].message.content
    sampled = [
        oai.chat.completions.create(
            model="tiny",
            messages=HI,
            seed=seed,
            temperature=1.0,
            max_tokens=12,
            extra_body=UNTIL_LIMIT,
        )
        for seed in (1, 2)
    ]
    assert [a.usage.completion_tokens for a in sampled] == [12, 12]  # the request's own
    assert sampled[0].choices[0].message.content != sampled[1].choices[0].message.content
    # the policy's defaults for the model go over the checkpoint's, on both OpenAI doors
    capped = oai.chat.completions.create(model="tiny-capped", messages=HI, extra_body=UNTIL_LIMIT)
    assert capped.usage.completion_tokens == 3
    legacy = oai.completions.create(model="tiny-capped", prompt="Hi", extra_body=UNTIL_LIMIT)
    assert legacy.usage.completion_tokens == 3


def test_with_no_recommendation_a_cpu_answer_stops_at_256_tokens(start_gateway, checkpoint):
    # the tiny checkpoint's context is 32768 tokens: the answer is not allowed to fill it
    gateway, key = start_gateway(local_policy(checkpoint, kv_cache_bytes=64 * 1024 * 1024))
    reply = client(gateway, key).chat.completions.create(
        model="tiny", messages=HI, extra_body=UNTIL_LIMIT
    )
    assert reply.usage.completion_tokens == CPU_DEFAULT_MAX_TOKENS == 256
    assert reply.choices[0].finish_reason == "length"
