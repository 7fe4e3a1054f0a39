"""Structured outputs through a real gateway serving the local engine (tiny random Qwen3).

The official openai SDK's own structured-output helpers (``chat.completions.parse`` and
``.stream`` with a pydantic model, ``responses.parse`` with ``text_format``) get objects of
the model back, because the engine's grammar mask guarantees the schema even from random
weights. vLLM's ``guided_*`` fields and ``structured_outputs`` object arrive as the SDK sends
them (``extra_body``); ``logit_bias`` is honoured; a spec the engine cannot compile, or two
constraints at once, is a 400 naming the param.
"""

from __future__ import annotations

import json
import re
from typing import Literal

import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel, Field

MESSAGES = [{"role": "user", "content": "Describe a pet as JSON."}]


class Pet(BaseModel):
    # bounded fields: a random-weight model reaches the end of the schema in few tokens
    name: str = Field(min_length=1, max_length=6)
    kind: Literal["cat", "dog", "fish"]
    age: int = Field(ge=0, le=30)
    vaccinated: bool
    moods: list[Literal["calm", "loud", "sleepy"]] = Field(max_length=2)


@pytest.fixture
def client(local_gateway, api_key) -> OpenAI:
    return OpenAI(base_url=local_gateway.v1, api_key=api_key, max_retries=0, timeout=120)


@pytest.mark.parametrize("seed", [1, 2])
def test_chat_completions_parse_returns_the_pydantic_object(client, seed):
    reply = client.chat.completions.parse(
        model="tiny",
        messages=MESSAGES,
        response_format=Pet,
        max_tokens=120,
        temperature=1.0,
        seed=seed,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Pet)
    assert Pet.model_validate_json(choice.message.content) == choice.message.parsed


def test_beta_parse_streamed_returns_the_pydantic_object(client):
    args = dict(model="tiny", messages=MESSAGES, response_format=Pet, max_tokens=120, seed=5)
    whole = client.beta.chat.completions.parse(**args, temperature=1.0)
    with client.chat.completions.stream(**args, temperature=1.0) as stream:
        deltas = [event.delta for event in stream if event.type == "content.delta"]
        final = stream.get_final_completion()
    parsed = final.choices[0].message.parsed
    assert isinstance(parsed, Pet) and len(deltas) > 1
    assert final.choices[0].message.content == "".join(deltas)
    assert parsed == whole.choices[0].message.parsed  # same seed, same tokens


def test_responses_text_format_json_schema_returns_the_object(client):
    response = client.responses.parse(
        model="tiny", input="Describe a pet as JSON.", text_format=Pet, max_output_tokens=120
    )
    assert isinstance(response.output_parsed, Pet)
    assert Pet.model_validate_json(response.output_text) == response.output_parsed


def test_anthropic_output_config_format_reaches_the_engine(local_gateway, api_key):
    """The Anthropic door's structured outputs (``output_config.format`` json_schema), through
    the gateway's translation to the engine's Chat Completions."""
    import anthropic

    sdk = anthropic.Anthropic(base_url=local_gateway.base_url, api_key=api_key, max_retries=0)
    schema = Pet.model_json_schema()
    message = sdk.messages.create(
        model="tiny",
        max_tokens=120,
        messages=MESSAGES,
        extra_body={"output_config": {"format": {"type": "json_schema", "schema": schema}}},
    )
    assert message.stop_reason == "end_turn"
    assert isinstance(Pet.model_validate_json(message.content[0].text), Pet)


def test_json_object_and_vllm_extensions_are_honoured(client, tokenizer):
    args = dict(model="tiny", messages=MESSAGES, max_tokens=60, temperature=1.0, seed=3)

    def content(**extra) -> str:
        reply = client.chat.completions.create(**args, **extra).choices[0]
        assert reply.finish_reason == "stop", reply
        return reply.message.content

    regex = r"[A-Z]{2}-[0-9]{3}"
    assert re.fullmatch(regex, content(extra_body={"guided_regex": regex}))
    assert content(extra_body={"guided_choice": ["red", "green"]}) in ("red", "green")
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 5}},
        "required": ["n"],
    }
    assert 1 <= json.loads(content(extra_body={"guided_json": schema}))["n"] <= 5
    assert 1 <= json.loads(content(extra_body={"guided_json": json.dumps(schema)}))["n"] <= 5
    grammar = 'root ::= "x" [0-9] [0-9]'
    assert re.fullmatch(r"x\d\d", content(extra_body={"guided_grammar": grammar}))
    newer = {"structured_outputs": {"choice": ["up", "down"]}}
    assert content(extra_body=newer) in ("up", "down")
    assert re.fullmatch(regex, content(extra_body={"structured_outputs": {"regex": regex}}))
    # json_object: any object; a bias towards the closing brace and EOS ends it at once
    bias = {str(tokenizer.token_to_id("}")): 100, **{str(t): 100 for t in tokenizer.eos_token_ids}}
    text = content(response_format={"type": "json_object"}, logit_bias=bias)
    assert json.loads(text) == {}


def test_logit_bias_is_honoured(client, tokenizer):
    token = tokenizer.encode(" fox", add_special_tokens=False)[-1]
    reply = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,
        logit_bias={str(token): 100},
        extra_body={"ignore_eos": True},
    )
    assert reply.choices[0].message.content == tokenizer.decode([token] * 4)


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "broken",
                        "schema": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}},
                    },
                }
            },
            "response_format.json_schema.schema",
            "cannot be compiled",
        ),
        ({"extra_body": {"guided_regex": "(unclosed"}}, "guided_regex", "cannot be compiled"),
        ({"extra_body": {"guided_grammar": "root ::= nowhere"}}, "guided_grammar", "compiled"),
        ({"extra_body": {"guided_choice": []}}, "guided_choice", "non-empty"),
        ({"extra_body": {"guided_json": "{not json"}}, "guided_json", "JSON schema"),
        (
            {"extra_body": {"structured_outputs": {"regex": "a", "choice": ["b"]}}},
            "structured_outputs",
            "exactly one",
        ),
        (
            {"extra_body": {"structured_outputs": {"structural_tag": "{}"}}},
            "structured_outputs.structural_tag",
            "does not support",
        ),
        (
            {"response_format": {"type": "json_object"}, "extra_body": {"guided_regex": "a"}},
            "guided_regex",
            "one structured output constraint",
        ),
        ({"logit_bias": {"999999": 5}}, "logit_bias", "outside the vocabulary"),
        ({"logit_bias": {"5": 500}}, "logit_bias", "[-100, 100]"),
        ({"logit_bias": {"five": 1}}, "logit_bias", "token ids"),
    ],
)
def test_bad_structured_outputs_are_400_naming_the_param(client, extra, param, words):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, **extra)
    assert caught.value.body["param"] == param
    assert words in caught.value.message


def test_a_schema_that_cannot_compile_is_a_400_streamed_too(client):
    with pytest.raises(openai.BadRequestError) as caught:
        list(
            client.chat.completions.create(
                model="tiny",
                messages=MESSAGES,
                max_tokens=5,
                stream=True,
                extra_body={"guided_regex": "[z-a]"},
            )
        )
    assert caught.value.body["param"] == "guided_regex"
    assert "cannot be compiled" in caught.value.message
