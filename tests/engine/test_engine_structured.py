"""Structured outputs in the engine: the grammar's token mask inside the batched sampler.

Random-weight tiny Llama on the CPU: every constrained output parses and validates against its
schema (50 seeded random schemas), regex/choice/grammar outputs match (json_object with logit_bias), greedy
unconstrained neighbours still equal HF transformers token for token, the asynchronous
scheduler gives the same tokens, compiles are cached, logprobs are the constrained
distribution, and logit_bias is honoured in the same sampler step.
"""

from __future__ import annotations

import json
import math
import random
import re

import jsonschema
import numpy as np
import pytest
import torch
from engine_helpers import MAX_NEW_TOKENS, assert_all_blocks_free, make_llm
from structured_schemas import random_schema

from engine.errors import GrammarError, SamplingParamsError
from engine.layers.token_mask import TokenMask
from engine.sampling import SamplingParams
from engine.structured.spec import StructuredOutput

PROMPT = "Answer in JSON:"


@pytest.fixture(scope="module")
def llm(llama_path):
    return make_llm(llama_path, max_num_seqs=64)


def _constrained(spec: StructuredOutput, **settings: object) -> SamplingParams:
    settings.setdefault("temperature", 0.0)
    settings.setdefault("max_tokens", 400)
    return SamplingParams(structured=spec, **settings)  # type: ignore[arg-type]


def test_fifty_random_schemas_every_output_parses_and_validates(llm):
    rng = random.Random(28)
    schemas = [random_schema(rng) for _ in range(50)]
    params = [
        # half greedy, half sampled with their own seeds: many different paths through them
        _constrained(StructuredOutput.json_schema(s), temperature=1.0 if i % 2 else 0.0, seed=i)
        for i, s in enumerate(schemas)
    ]
    outputs = llm.generate([PROMPT] * len(schemas), params)
    for schema, out in zip(schemas, outputs, strict=True):
        assert out.finish_reason == "stop", (schema, out.text)
        jsonschema.validate(json.loads(out.text), schema)
    # the outputs are not all alike: the grammar decides the shape, the model the values
    assert len({out.text for out in outputs}) > 40
    assert_all_blocks_free(llm)


def test_regex_choice_and_grammar_outputs_match(llm):
    cases = [
        (
            StructuredOutput.regex(r"[a-c]{2,4}-\d{2}"),
            lambda t: re.fullmatch(r"[a-c]{2,4}-\d{2}", t),
        ),
        (
            StructuredOutput.choice(["yes", "no", "maybe so"]),
            lambda t: t in ("yes", "no", "maybe so"),
        ),
        (
            StructuredOutput.grammar('root ::= "(" digit+ ("," digit+)? ")"\ndigit ::= [0-9]'),
            lambda t: re.fullmatch(r"\(\d+(,\d+)?\)", t),
        ),
    ]
    for seed in range(3):
        params = [
            _constrained(spec, temperature=1.0, seed=seed, max_tokens=200) for spec, _ in cases
        ]
        outputs = llm.generate(["the fox"] * len(cases), params)
        for (spec, check), out in zip(cases, outputs, strict=True):
            assert out.finish_reason == "stop" and check(out.text), (spec, out.text)


def test_structural_tag_outputs_are_text_around_schema_valid_json(llm):
    """A structural tag (how the gateway forces a tool call): literal text, then JSON of the
    schema, then text; one or more times with a separator."""
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    }
    one = {
        "type": "tag",
        "begin": "<c>",
        "content": {"type": "json_schema", "json_schema": schema},
        "end": "</c>",
    }
    more = {"type": "sequence", "elements": [{"type": "const_string", "value": ";"}, one]}
    tag = {"type": "sequence", "elements": [one, {"type": "star", "content": more}]}
    spec = StructuredOutput.structural_tag({"type": "structural_tag", "format": tag})
    params = [_constrained(spec, temperature=1.0, seed=seed, max_tokens=300) for seed in range(4)]
    for out in llm.generate(["the fox"] * 4, params):
        assert out.finish_reason == "stop", out.text
        parts = out.text.split(";")
        for part in parts:
            assert part.startswith("<c>") and part.endswith("</c>"), out.text
            jsonschema.validate(json.loads(part[3:-4], strict=False), schema)


def test_json_object_with_logit_bias_closes_the_object(llm):
    """Any JSON object (unbounded: a random model would wander); a bias towards the closing
    brace and EOS ends it at once, and the grammar still decides what may come first."""
    tokenizer = llm.tokenizer
    close = tokenizer.token_to_id("}")
    eos = sorted(llm.engine.eos_token_ids)
    bias = {close: 100.0, **{t: 100.0 for t in eos}}
    params = _constrained(StructuredOutput.json_object(), logit_bias=bias, max_tokens=20)
    out = llm.generate(["the fox"], params)[0]
    assert out.finish_reason == "stop"
    assert json.loads(out.text) == {}


def test_unconstrained_neighbours_equal_hf_token_for_token(llama_path, hf_reference):
    """Constrained requests share every step with the greedy ones and change nothing for
    them; under asynchronous scheduling too (there a constrained row waits for its token)."""
    prompts, expected = hf_reference("llama")
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
    }
    specs = [
        StructuredOutput.json_schema(schema),
        StructuredOutput.regex(r"[0-9]{3}"),
        StructuredOutput.choice(["left", "right"]),
    ]
    batch, params = [], []
    for index, prompt in enumerate(prompts):
        batch.append(prompt)
        params.append(greedy)
        if index % 5 == 0:
            batch.append(prompt)
            params.append(_constrained(specs[(index // 5) % len(specs)], max_tokens=30))
    results = {}
    for async_scheduling in (False, True):
        llm = make_llm(llama_path, max_num_seqs=8, async_scheduling=async_scheduling)
        outputs = llm.generate(batch, params)
        free = [o.token_ids for o, p in zip(outputs, params, strict=True) if p.structured is None]
        assert free == expected
        results[async_scheduling] = [o.text for o in outputs]
        steps = llm.engine.stats.step_history()
        assert any(len(s.request_ids) > 1 for s in steps)  # they did share steps
        assert_all_blocks_free(llm)
    assert results[True] == results[False]


def test_asynchronous_scheduling_gives_the_same_constrained_tokens(llama_path):
    rng = random.Random(7)
    specs = [StructuredOutput.json_schema(random_schema(rng)) for _ in range(6)]
    params = [_constrained(s, temperature=1.0, seed=i) for i, s in enumerate(specs)]
    texts = {}
    for async_scheduling in (False, True):
        llm = make_llm(llama_path, async_scheduling=async_scheduling)
        texts[async_scheduling] = [o.text for o in llm.generate([PROMPT] * len(specs), params)]
    assert texts[True] == texts[False]


def test_a_spec_is_compiled_once_and_the_cache_is_bounded(llm):
    grammars = llm.engine.grammars
    spec = StructuredOutput.regex(r"cache-[0-9]")
    before = grammars.num_compiled
    first = grammars.compile(spec)
    assert grammars.compile(StructuredOutput.regex(r"cache-[0-9]")) is first
    llm.generate(["a", "b"], [_constrained(spec), _constrained(spec)])
    assert grammars.num_compiled == before + 1
    size, grammars.cache_size = grammars.cache_size, 2
    try:
        for pattern in ("x[0-9]", "y[0-9]", "z[0-9]"):
            grammars.compile(StructuredOutput.regex(pattern))
        assert grammars.cached(StructuredOutput.regex("x[0-9]")) is None  # least recent out
        assert grammars.cached(StructuredOutput.regex("z[0-9]")) is not None
    finally:
        grammars.cache_size = size


@pytest.mark.parametrize(
    "spec",
    [
        StructuredOutput.json_schema({"type": "object", "properties": {"a": {"$ref": "#/nope"}}}),
        StructuredOutput.regex("(unclosed"),
        StructuredOutput.grammar("root ::= undefined_rule"),
    ],
)
def test_a_spec_that_cannot_compile_is_a_grammar_error_and_adds_nothing(llm, spec):
    with pytest.raises(GrammarError, match=f"the {spec.kind} cannot be compiled"):
        llm.generate([PROMPT], _constrained(spec))
    assert not llm.engine.requests
    assert_all_blocks_free(llm)


def test_min_tokens_with_a_constraint_is_refused():
    with pytest.raises(SamplingParamsError, match="min_tokens"):
        SamplingParams(min_tokens=2, structured=StructuredOutput.regex("a+"))


def test_logprobs_are_the_constrained_distribution(llm):
    """Only the tokens the grammar allows are reported, renormalised among themselves."""
    tokenizer = llm.tokenizer
    out = llm.generate(["the fox"], _constrained(StructuredOutput.regex("[ab]"), logprobs=5))[0]
    first = out.outputs[0].logprobs[0]
    allowed = {t for t in first.top if tokenizer.decode([t]) in ("a", "b")}
    assert first.top and set(first.top) == allowed
    assert math.isclose(sum(math.exp(lp) for lp in first.top.values()), 1.0, rel_tol=1e-4)
    plain = llm.generate(["the fox"], SamplingParams(temperature=0, max_tokens=1, logprobs=5))[0]
    assert len(plain.outputs[0].logprobs[0].top) == 5  # unconstrained: the model's own top 5


def test_logit_bias_is_honoured_in_the_sampler(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    base = llm.generate(["the fox"], greedy)[0].token_ids
    target = next(t for t in range(5, 100) if t not in base)
    forced = SamplingParams(
        temperature=0.0, max_tokens=6, ignore_eos=True, logit_bias={target: 100.0}
    )
    banned = SamplingParams(
        temperature=0.0, max_tokens=6, ignore_eos=True, logit_bias={base[0]: -100.0}
    )
    outs = llm.generate(["the fox", "the fox", "the fox"], [forced, banned, greedy])
    assert outs[0].token_ids == [target] * 6
    assert outs[1].token_ids[0] != base[0]
    assert outs[2].token_ids == base  # its neighbours' biases are not its own
    with pytest.raises(SamplingParamsError, match="logit_bias"):
        SamplingParams(logit_bias={3: 101.0})
    with pytest.raises(SamplingParamsError, match="outside the vocabulary"):
        llm.generate(["x"], SamplingParams(logit_bias={10**6: 1.0}))


@pytest.mark.parametrize("all_rows", [False, True])
def test_token_mask_matches_the_bit_definition_and_leaves_other_rows(all_rows):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 70, generator=generator)  # wider than the 64 tokens the mask covers
    rows = torch.arange(5) if all_rows else torch.tensor([0, 2, 4])
    bitmask = torch.randint(
        -(2**31), 2**31 - 1, (len(rows), 2), dtype=torch.int32, generator=generator
    )
    expected = logits.clone()
    for i, row in enumerate(rows.tolist()):
        for token in range(70):
            word = int(bitmask[i, token // 32]) if token < 64 else 0
            if not (word >> (token % 32)) & 1:
                expected[row, token] = float("-inf")
    TokenMask().apply(logits, rows, bitmask)
    assert torch.equal(logits, expected)


def test_a_vocabulary_padded_past_the_tokenizer_never_allows_the_padding(llm):
    """Logits wider than the tokenizer (Qwen's 151,936 rows for 151,669 tokens): the mask
    covers the model's width and the padding ids are never allowed, even by EOS rules."""
    from engine.structured.compiler import GrammarCompiler
    from engine.structured.matcher import fill_bitmask

    tokenizer = llm.tokenizer
    real = tokenizer.vocab_size
    padded = real + 45
    grammars = GrammarCompiler(tokenizer, padded, sorted(llm.engine.eos_token_ids))
    for spec in (StructuredOutput.regex("[ab]"), StructuredOutput.json_object()):
        matcher = grammars.matcher(grammars.compile(spec))
        bitmask = np.zeros((1, -(-padded // 32)), dtype=np.int32)
        fill_bitmask([matcher], bitmask)
        bits = np.unpackbits(bitmask.view(np.uint8), bitorder="little")[:padded]
        allowed = set(np.flatnonzero(bits).tolist())
        assert allowed and max(allowed) < real
    assert {tokenizer.decode([t]) for t in allowed} >= {"{"}  # json_object opens an object
