"""The bundled real model, SmolLM2-135M-Instruct (Q4_1 GGUF), against HF transformers.

HF loads the same file (`from_pretrained(dir, gguf_file=...)`, its own GGUF reader, tokenizer
conversion and dequantization). Greedy, fp32, CPU: 16 chat conversations through the chat
template, 32 new tokens each (two more end early: the capital of France in eight tokens,
a sum in 22);
each side runs them as one batch (HF left-padded). About 30 s on 2 cores: marked slow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
# ~30 s on a quiet 2-core box; a shared one can make it several times slower
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

from engine.core.llm_engine import LLM  # noqa: E402
from engine.gguf.bundled import find_bundled_model  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402

NEW_TOKENS = 32
SYSTEM = {"role": "system", "content": "You are a concise assistant. Answer in full sentences."}
CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Explain in detail why the sky is blue."}],
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "user", "content": "List five fruits and describe each one."}],
    [SYSTEM, {"role": "user", "content": "How do airplanes stay in the air?"}],
    [{"role": "user", "content": "What is 12 times 34? Show your working step by step."}],
    [{"role": "user", "content": "Give me three tips for learning to cook."}],
    [{"role": "user", "content": "Describe the water cycle to a ten-year-old."}],
    [
        {"role": "user", "content": "Hi! Who are you?"},
        {"role": "assistant", "content": "I am SmolLM, a small assistant."},
        {"role": "user", "content": "Tell me a fun fact about octopuses."},
    ],
    [
        {
            "role": "user",
            "content": "Write a Python function that reverses a string, and explain it.",
        }
    ],
    [SYSTEM, {"role": "user", "content": "Why do we have seasons on Earth?"}],
    [{"role": "user", "content": "Tell me about the history of the bicycle."}],
    [{"role": "user", "content": "Summarise the story of Cinderella in a paragraph."}],
    [{"role": "user", "content": "What are the benefits of regular exercise? Explain."}],
    [{"role": "user", "content": "Café, naïve, déjà vu: what do these words have in common?"}],
    [{"role": "user", "content": "Compare cats and dogs as pets, with pros and cons."}],
    [{"role": "user", "content": "How does a refrigerator keep food cold?"}],
    [{"role": "user", "content": "Explain how vaccines work."}],
]
TEXTS = [
    "Hello, world!",
    "  leading spaces and trailing  ",
    "Numbers 0 1 2 3 42 1,234,567 3.14159 and 2026-11-30",
    "Café naïve façade jalapeño über smörgåsbord",
    "日本語のテキスト 中文文本 한국어 🙂🚀✨",
    "def add(a, b):\n    return a + b  # tabs\tand\nnewlines\r\n",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
]


@pytest.fixture(scope="module")
def model_file() -> Path:
    return find_bundled_model()


@pytest.fixture(scope="module")
def llm(model_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    engine = LLM(
        model_file,
        progress=False,
        device="cpu",
        download_dir=str(tmp_path_factory.mktemp("models")),
        max_num_seqs=len(CONVERSATIONS),
        kv_cache_bytes=64 * 1024 * 1024,
        quantization="none",  # the float32 path: HF dequantizes the file too
    )
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def hf(model_file: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_file.parent, gguf_file=model_file.name)
    model = AutoModelForCausalLM.from_pretrained(
        model_file.parent, gguf_file=model_file.name, dtype=torch.float32
    )
    return tokenizer, model.eval()


def test_the_chat_template_renders_and_tokenizes_as_hf_does(llm: Any, hf: tuple) -> None:
    hf_tokenizer, _ = hf
    for messages in CONVERSATIONS:
        ours = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        theirs = hf_tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        assert ours == theirs
        assert llm.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True
        ) == hf_tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    assert "SmolLM" in ours  # the template's default system prompt came from the metadata


def test_text_encodes_and_decodes_as_hf_does(llm: Any, hf: tuple) -> None:
    hf_tokenizer, _ = hf
    for text in TEXTS:
        ids = llm.tokenizer.encode(text)
        assert ids == hf_tokenizer(text)["input_ids"], text
        assert llm.tokenizer.decode(ids, skip_special_tokens=False) == hf_tokenizer.decode(ids)
    assert llm.tokenizer.eos_token_ids == {2}  # <|im_end|>, from tokenizer.ggml.eos_token_id


def test_numeric_characters_split_one_by_one_as_in_llama_cpp(llm: Any, hf: tuple) -> None:
    """The one deliberate difference: the file names its pre-tokenizer `smollm`, which llama.cpp
    (like SmolLM2's own tokenizer.json) runs as "every numeric character alone, then GPT-2's
    regex". HF's GGUF conversion skips the first step. That shows only where a merge joins a
    numeric character to its neighbour, as `Ġ Â` does before `½`; ASCII digits have no such
    merges, so ordinary numbers tokenize the same either way (the tests above)."""
    hf_tokenizer, _ = hf
    text = "x² + y³ = z¹⁰; ½ ⅓"
    ours = llm.tokenizer.encode(text)
    theirs = hf_tokenizer(text)["input_ids"]
    assert llm.tokenizer.decode(ours) == hf_tokenizer.decode(theirs) == text
    assert hf_tokenizer.convert_ids_to_tokens(ours)[-6:-4] == ["Ġ", "Â½"]
    assert hf_tokenizer.convert_ids_to_tokens(theirs)[-5:-3] == ["ĠÂ", "½"]


def test_greedy_chat_continuations_equal_hf_token_for_token(llm: Any, hf: tuple) -> None:
    _, model = hf
    prompts = [
        llm.tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True)
        for m in CONVERSATIONS
    ]
    ours = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS))
    # HF in one left-padded batch (its attention mask and position ids skip the padding)
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[2] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        generated = model.generate(
            ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=2
        )[:, width:].tolist()
    full_length = 0
    for prompt, output, row in zip(prompts, ours, generated, strict=True):
        reference = row[: row.index(2) + 1] if 2 in row else row  # up to EOS, then padding
        assert output.token_ids == reference, llm.tokenizer.decode(prompt)
        full_length += len(reference) == NEW_TOKENS
    assert full_length >= 16  # 16 full-length answers (two end early, the capital in eight)
    assert ours[0].text == "The capital of France is Paris."


def test_structured_outputs_from_the_real_tokenizer_validate(llm: Any) -> None:
    """The bundled model under a schema (SmolLM2's 49k byte-level vocabulary, greedy) and a
    choice, in one batch: the outputs parse and match."""
    import json

    import jsonschema

    from engine.structured.spec import StructuredOutput

    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "country": {"type": "string", "maxLength": 20},
            "population_millions": {"type": "number", "minimum": 0, "maximum": 50},
            "continent": {"enum": ["Europe", "Asia", "Africa", "America", "Oceania"]},
            "landmarks": {
                "type": "array",
                "items": {"type": "string", "maxLength": 24},
                "maxItems": 3,
            },
        },
        "required": ["city", "country", "population_millions", "continent", "landmarks"],
        "additionalProperties": False,
    }
    ask = [{"role": "user", "content": "Describe Paris as a JSON object."}]
    pick = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]
    prompts = [
        llm.tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True)
        for m in (ask, pick)
    ]
    params = [
        SamplingParams(
            temperature=0.0, max_tokens=160, structured=StructuredOutput.json_schema(schema)
        ),
        SamplingParams(
            temperature=0.0, max_tokens=8, structured=StructuredOutput.choice(["yes", "no"])
        ),
    ]
    described, answer = llm.generate(prompts, params)
    assert described.finish_reason == "stop"
    city = json.loads(described.text)
    jsonschema.validate(city, schema)
    assert city["city"] == "Paris"
    assert answer.text in ("yes", "no")
