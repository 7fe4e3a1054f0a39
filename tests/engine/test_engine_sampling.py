"""Sampling: seeds, top-k, stop strings and ids, n > 1 sharing, logprobs, penalties (the
repetition penalty against HF's), validation."""

from __future__ import annotations

import pytest
from engine_helpers import assert_all_blocks_free, make_llm

from engine.core.llm_engine import LLMEngine
from engine.errors import SamplingParamsError
from engine.sampling import SamplingParams


@pytest.fixture(scope="module")
def llm(llama_path):
    return make_llm(llama_path)


@pytest.fixture(autouse=True)
def blocks_return_after_each_test(request):
    """Every test leaves the shared engine with all blocks free and nothing queued."""
    yield
    if "llm" in request.fixturenames:
        assert_all_blocks_free(request.getfixturevalue("llm"))


PROMPTS = ["the quick brown fox", "a gateway sends each request", "numbers: 1 2 3", "café 🙂"]


def test_seed_reproduces_alone_and_in_a_batch(llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=20)
    alone = llm.generate([PROMPTS[0]], seeded)[0].token_ids
    again = llm.generate([PROMPTS[0]], seeded)[0].token_ids
    others = SamplingParams(temperature=1.3, max_tokens=12)  # unseeded neighbours
    in_batch = llm.generate([*PROMPTS[1:], PROMPTS[0]], [others, others, others, seeded])
    assert alone == again == in_batch[3].token_ids
    different = llm.generate(
        [PROMPTS[0]], SamplingParams(temperature=1.0, top_p=0.95, seed=99, max_tokens=20)
    )
    assert different[0].token_ids != alone
    assert_all_blocks_free(llm)


def test_top_k_one_equals_greedy(llm):
    greedy = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=16))
    top1 = llm.generate(PROMPTS, SamplingParams(temperature=1.5, top_k=1, max_tokens=16))
    assert [o.token_ids for o in greedy] == [o.token_ids for o in top1]


def test_stop_string_cuts_exactly_and_never_leaks(llm):
    base = llm.generate([PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=24))[0]
    text = base.text
    assert len(text) > 6
    stop = text[3:6]  # a string the greedy output is known to contain
    cut = llm.generate([PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=24, stop=[stop]))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == text[: text.index(stop)]
    assert stop not in cut.text
    assert base.token_ids[: len(cut.token_ids)] == cut.token_ids


def test_stop_token_ids_min_tokens_and_length(llm):
    base = llm.generate([PROMPTS[2]], SamplingParams(temperature=0.0, max_tokens=12))[0]
    assert base.finish_reason == "length" and len(base.token_ids) == 12
    target = base.token_ids[4]
    first = base.token_ids.index(target)
    stopped = llm.generate(
        [PROMPTS[2]], SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[target])
    )[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids == base.token_ids[: first + 1]
    held = llm.generate(
        [PROMPTS[2]],
        SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[target], min_tokens=12),
    )[0]
    assert len(held.token_ids) == 12 and target not in held.token_ids


def test_n_samples_share_prompt_blocks(llama_path):
    llm = make_llm(llama_path, enable_prefix_caching=False)
    engine: LLMEngine = llm.engine
    prompt = engine.tokenizer.encode("the quick brown fox jumps over the lazy dog " * 3)
    assert len(prompt) % 16 != 1  # the fork leaves a partially filled, shared last block
    request = engine.add_request(
        "n4", prompt, SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=8)
    )
    while len(request.seqs) < 4:
        engine.step()
    tables = [seq.block_table for seq in request.seqs]
    assert all(table == tables[0] for table in tables)
    assert all(engine.block_manager.ref_count(b) == 4 for b in tables[0])
    engine.step()  # each fork writes the last prompt token: the partial block is copied
    full = (len(prompt) - 1) // 16
    shared = request.seqs[0].block_table[:full]
    assert all(seq.block_table[:full] == shared for seq in request.seqs)
    assert all(engine.block_manager.ref_count(b) == 4 for b in shared)
    assert len({seq.block_table[full] for seq in request.seqs}) == 4
    while engine.has_unfinished_requests():
        engine.step()
    out = engine.request_output(request)
    assert [o.index for o in out.outputs] == [0, 1, 2, 3]
    assert all(len(o.token_ids) == 8 for o in out.outputs)
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1  # seeds differ per sample
    assert_all_blocks_free(llm)


def test_logprobs_are_returned_per_token(llm):
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=5, logprobs=3))[0]
    assert out.outputs[0].logprobs is not None and len(out.outputs[0].logprobs) == 5
    for token, entry in zip(out.token_ids, out.outputs[0].logprobs, strict=True):
        assert entry.token_id == token and len(entry.top) == 3
        assert max(entry.top.values()) == pytest.approx(entry.logprob)  # greedy = top-1
        assert all(v <= 0 for v in entry.top.values())


def test_penalties_change_repetitive_output(llm):
    plain = llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=24))[0]
    penalised = llm.generate(
        [PROMPTS[0]],
        SamplingParams(temperature=0.0, max_tokens=24, frequency_penalty=2.0, presence_penalty=2.0),
    )[0]
    assert len(set(penalised.token_ids)) >= len(set(plain.token_ids))
    assert penalised.token_ids != plain.token_ids


def test_repetition_penalty_equals_hf_token_for_token(llm, llama_path):
    """HF's meaning: every token of the prompt or the output so far has its logit divided by
    the penalty when positive, multiplied when negative; greedy continuations must match.
    Also with asynchronous scheduling and preemption, where the device-side "seen" rows are
    marked from the previous step's samples and rebuilt when a sequence is readmitted."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(llama_path, dtype=torch.float32).eval()
    squeezed = make_llm(llama_path, async_scheduling=True, num_gpu_blocks=4)
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS]
    for penalty in (1.3, 0.7):
        params = SamplingParams(temperature=0.0, max_tokens=16, repetition_penalty=penalty)
        # one batch mixing penalised and plain rows: each row keeps its own setting
        plain = SamplingParams(temperature=0.0, max_tokens=16)
        batch = [params] * len(prompts) + [plain]
        ours = llm.generate(prompts + prompts[:1], batch)
        late = squeezed.generate(prompts + prompts[:1], batch)
        with torch.inference_mode():
            for prompt, output, async_output in zip(prompts, ours, late, strict=False):
                ids = torch.tensor([prompt])
                expected = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=16,
                    do_sample=False,
                    repetition_penalty=penalty,
                )[0, len(prompt) :].tolist()
                assert output.token_ids == expected, (penalty, prompt)
                assert async_output.token_ids == expected, ("async", penalty, prompt)
        unpenalised = llm.generate(prompts[:1], plain)[0].token_ids
        assert ours[-1].token_ids == late[-1].token_ids == unpenalised
        assert ours[0].token_ids != unpenalised  # the penalty did change this output
    assert squeezed.engine.stats.snapshot()["num_preemptions"] > 0
    assert_all_blocks_free(squeezed)


def test_include_stop_str_in_output_keeps_the_stop_string(llm):
    base = llm.generate([PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=24))[0].text
    stops = [base[7:9], base[3:6]]  # the earlier match wins, wherever it is listed
    kept = llm.generate(
        [PROMPTS[1]],
        SamplingParams(temperature=0.0, max_tokens=24, stop=stops, include_stop_str_in_output=True),
    )[0]
    assert kept.finish_reason == "stop"
    assert kept.text == base[: base.index(stops[1]) + len(stops[1])]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("repetition_penalty", 0.0),
        ("repetition_penalty", 2.5),
        ("temperature", -0.1),
        ("top_p", 0.0),
        ("top_k", -5),
        ("min_p", 1.5),
        ("max_tokens", 0),
        ("n", 0),
        ("logprobs", 50),
        ("presence_penalty", 3.0),
        ("stop", [""]),
    ],
)
def test_bad_sampling_params_name_the_field(field, value):
    with pytest.raises(SamplingParamsError, match=field):
        SamplingParams(**{field: value})
