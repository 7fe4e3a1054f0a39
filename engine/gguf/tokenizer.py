"""The tokenizer a GGUF file describes, as HF tokenizer files (`tokenizer.json` and friends).

llama.cpp stores the vocabulary, merges, token types, special token ids, the pre-tokenizer's
name (`tokenizer.ggml.pre`) and the Jinja chat template as metadata. `tokenizer_files()` turns
them into the three files `engine.tokenizer.Tokenizer` reads, so a GGUF model is tokenized by
the same code as an HF directory. Supported: byte-level BPE vocabularies (`tokenizer.ggml.model`
= gpt2: GPT-2, Llama 3, Qwen2/3, SmolLM); control tokens become special added tokens and
user-defined ones plain added tokens, as llama.cpp matches both whole. A pre-tokenizer or
vocabulary type not listed here is a `TokenizerError`: splitting text differently from training
would change every prompt's tokens.
"""

from __future__ import annotations

import json
from typing import Any

from engine.errors import TokenizerError

# llama.cpp token types
_CONTROL = 3
_USER_DEFINED = 4

# The split regexes of the well-known byte-level pre-tokenizers (applied before byte mapping).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_PRE_TOKENIZERS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
# GPT-2's regex, with every numeric character split off first (StarCoder-style vocabularies)
_DIGIT_PRE_TOKENIZERS = ("smollm", "starcoder", "refact")
_GPT2_PRE_TOKENIZERS = (None, "default", "gpt2")
SUPPORTED_PRE_TOKENIZERS = (
    "default",
    "gpt2",
    *_DIGIT_PRE_TOKENIZERS,
    *_SPLIT_PRE_TOKENIZERS,
)


def _pre_tokenizer(pre: str | None) -> Any:
    from tokenizers import Regex, pre_tokenizers

    if pre in _GPT2_PRE_TOKENIZERS:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_PRE_TOKENIZERS:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre in _SPLIT_PRE_TOKENIZERS:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_SPLIT_PRE_TOKENIZERS[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    raise TokenizerError(
        f"GGUF pre-tokenizer {pre!r} is not supported; supported: "
        f"{', '.join(SUPPORTED_PRE_TOKENIZERS)}"
    )


def _token(metadata: dict[str, Any], key: str) -> str | None:
    index = metadata.get(f"tokenizer.ggml.{key}")
    tokens = metadata["tokenizer.ggml.tokens"]
    return tokens[int(index)] if index is not None and 0 <= int(index) < len(tokens) else None


def build_tokenizer_json(metadata: dict[str, Any]) -> str:
    """`tokenizer.json` text for the vocabulary in this GGUF metadata."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise TokenizerError(
            f"GGUF tokenizer model {kind!r} is not supported; supported: gpt2 (byte-level BPE)"
        )
    tokens: list[str] = list(metadata.get("tokenizer.ggml.tokens") or [])
    if not tokens:
        raise TokenizerError("GGUF metadata has no tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges") or []]
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = _pre_tokenizer(metadata.get("tokenizer.ggml.pre"))
    tokenizer.decoder = decoders.ByteLevel()
    types = list(metadata.get("tokenizer.ggml.token_type") or [])
    tokenizer.add_special_tokens(
        [
            AddedToken(t, normalized=False, special=True)
            for t, k in zip(tokens, types, strict=False)
            if k == _CONTROL
        ]
    )
    tokenizer.add_tokens(
        [
            AddedToken(t, normalized=False, special=False)
            for t, k in zip(tokens, types, strict=False)
            if k == _USER_DEFINED
        ]
    )
    bos = _token(metadata, "bos_token_id")
    if metadata.get("tokenizer.ggml.add_bos_token") and bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    if tokenizer.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise TokenizerError("GGUF vocabulary has duplicate or unmappable tokens")
    return tokenizer.to_str()


def tokenizer_files(metadata: dict[str, Any]) -> dict[str, str]:
    """File name -> text for `tokenizer.json`, `tokenizer_config.json`, `generation_config.json`."""
    config: dict[str, Any] = {
        "bos_token": _token(metadata, "bos_token_id"),
        "eos_token": _token(metadata, "eos_token_id"),
        "unk_token": _token(metadata, "unknown_token_id"),
        "pad_token": _token(metadata, "padding_token_id"),
        "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
    }
    template = metadata.get("tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    generation = {
        key.replace("padding", "pad"): int(metadata[f"tokenizer.ggml.{key}"])
        for key in ("bos_token_id", "eos_token_id", "padding_token_id")
        if metadata.get(f"tokenizer.ggml.{key}") is not None
    }
    return {
        "tokenizer.json": build_tokenizer_json(metadata),
        "tokenizer_config.json": json.dumps(config, ensure_ascii=False, indent=2),
        "generation_config.json": json.dumps(generation, indent=2),
    }
