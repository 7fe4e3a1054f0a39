"""HF-format tokenizer: `tokenizer.json` via `tokenizers`, chat templates via jinja2.

Special tokens and EOS ids come from `tokenizer_config.json`, `generation_config.json` and
`config.json` (in that order of precedence for EOS: all of them are honoured).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import TokenizerError
from engine.token_bytes import REPLACEMENT_CHAR, TokenBytes

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizer


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        return json.load(f)


def _token_text(value: Any) -> str | None:
    """`tokenizer_config.json` stores special tokens as strings or AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


class Tokenizer:
    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        root = Path(path)
        tokenizer_file = root / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise TokenizerError(f"no tokenizer.json in {root}")
        self._tok = HFTokenizer.from_file(str(tokenizer_file))
        config = _read_json(root / "tokenizer_config.json")
        generation = _read_json(root / "generation_config.json")
        model_config = _read_json(root / "config.json")

        self.chat_template: str | None = config.get("chat_template")
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.pad_token = _token_text(config.get("pad_token"))
        eos_ids = _as_id_list(generation.get("eos_token_id"))
        eos_ids += _as_id_list(model_config.get("eos_token_id"))
        if self.eos_token is not None and self.token_to_id(self.eos_token) is not None:
            eos_ids.append(self.token_to_id(self.eos_token))  # type: ignore[arg-type]
        self.eos_token_ids: frozenset[int] = frozenset(eos_ids)
        self.bos_token_id = self.token_to_id(self.bos_token) if self.bos_token else None
        self._special_ids = frozenset(
            tid
            for tok in self._tok.get_added_tokens_decoder().values()
            if tok.special
            for tid in [self._tok.token_to_id(tok.content)]
            if tid is not None
        )

    @property
    def backend(self) -> HFTokenizer:
        """The underlying `tokenizers.Tokenizer` (its Rust incremental decoder works on it)."""
        return self._tok

    @functools.cached_property
    def token_bytes(self) -> TokenBytes | None:
        """Each token's bytes when the decoder is byte-level (the detokenizers' table), else
        None. Built on first use (tens of ms), once per tokenizer."""
        return TokenBytes.build(self._tok)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        **template_kwargs: Any,
    ) -> str | list[int]:
        """Render `chat_template` like HF does; with `tokenize` return ids (no extra BOS)."""
        if not self.chat_template:
            raise TokenizerError("this model has no chat_template in tokenizer_config.json")
        text = self._render(messages, add_generation_prompt, template_kwargs)
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def _render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool, kwargs: dict[str, Any]
    ) -> str:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TokenizerError(f"chat template error: {message}")

        def tojson(value: Any, indent: int | None = None) -> str:
            return json.dumps(value, ensure_ascii=False, indent=indent)

        def strftime_now(fmt: str) -> str:
            return datetime.now().strftime(fmt)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        try:
            template = env.from_string(self.chat_template or "")
            return template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                pad_token=self.pad_token or "",
                **kwargs,
            )
        except TemplateError as exc:
            raise TokenizerError(f"chat template error: {exc}") from exc


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Decodes a short window ending at the newest token and emits only what extends the
    previously emitted text; while the window ends in U+FFFD (a multi-byte character split
    over tokens) nothing is emitted, so a half character never reaches the client.
    """

    _CONTEXT = 5  # tokens of left context so leading spaces decode as in the full text

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = list(prompt_ids[-self._CONTEXT :])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def push(self, token_id: int) -> str:
        """Add one token; return the new text it completes (may be empty)."""
        self._ids.append(token_id)
        decode = self._tokenizer.decode
        prefix_text = decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = decode(self._ids[self._prefix_offset :])
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT_CHAR):
            return ""
        delta = full_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return delta
