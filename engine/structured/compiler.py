"""Structured-output specs compiled into grammars, with xgrammar, once per spec (bounded LRU).

xgrammar was chosen by measurement on the SmolLM2 tokenizer (``python -m
bench.grammar``, docs/benchmarks.md): its per-token mask is several times cheaper
than llguidance's and outlines-core's at batch 1 and 16, which is what every constrained
token pays; llguidance compiles a schema faster, but a compile is paid once per schema and
cached here.

JSON output (``json_object``, ``json_schema``) never takes a token holding a control byte
(U+0000-U+001F): xgrammar's string rule lets them through, but JSON forbids them raw in a
string, and the compact separators leave no whitespace outside strings to need them. A
``structural_tag`` is not banned so: a tool call's own syntax has newlines around its JSON
(its parser reads such a string leniently, gateway/providers/tool_parsers.py). The
tokenizer's side (``xgrammar.TokenizerInfo``, seconds for a 49k vocabulary)
is built on the first compile, in the caller's thread, never at engine start.

``compile`` is thread-safe and may block for tens of milliseconds on a new spec: the gateway
calls it in a worker thread (``AsyncEngine.compile_structured``) so its event loop never
compiles; the step thread then finds it cached. A spec that xgrammar refuses is a
``GrammarError`` naming the kind and xgrammar's reason.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from engine.errors import GrammarError
from engine.structured.matcher import GrammarMatcher
from engine.structured.spec import StructuredOutput

if TYPE_CHECKING:
    from engine.tokenizer import Tokenizer

DEFAULT_CACHE_SIZE = 256


@dataclass(frozen=True)
class CompiledGrammar:
    spec: StructuredOutput
    compiled: Any  # xgrammar.CompiledGrammar

    @property
    def is_json(self) -> bool:
        return self.spec.kind in ("json_object", "json_schema")


class GrammarCompiler:
    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        stop_token_ids: list[int],
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        """``vocab_size``: the model's logits width (may exceed the tokenizer's: padding)."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(t for t in stop_token_ids if t < vocab_size)
        self.cache_size = cache_size
        self._cache: OrderedDict[StructuredOutput, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self._compiler_lock = threading.Lock()
        self._compiler: Any = None
        self._json_ban: torch.Tensor | None = None  # see the module's docstring
        self.num_compiled = 0  # compiles done (cache misses), for tests and stats

    def cached(self, spec: StructuredOutput) -> CompiledGrammar | None:
        with self._lock:
            found = self._cache.get(spec)
            if found is not None:
                self._cache.move_to_end(spec)
            return found

    def compile(self, spec: StructuredOutput) -> CompiledGrammar:
        found = self.cached(spec)
        if found is not None:
            return found
        compiled = CompiledGrammar(spec, self._compile(spec))
        with self._lock:
            self._cache[spec] = compiled
            self._cache.move_to_end(spec)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            self.num_compiled += 1
        return compiled

    def matcher(self, compiled: CompiledGrammar) -> GrammarMatcher:
        import xgrammar as xgr

        ban = self._json_ban if compiled.is_json else None
        return GrammarMatcher(xgr.GrammarMatcher(compiled.compiled), ban)

    # --- xgrammar ------------------------------------------------------------------------

    def _xgrammar(self) -> Any:
        import xgrammar as xgr

        with self._compiler_lock:
            if self._compiler is None:
                info = _tokenizer_info(self.tokenizer, self.vocab_size, self.stop_token_ids)
                self._json_ban = _control_byte_ban(info, self.vocab_size, self.stop_token_ids)
                self._compiler = xgr.GrammarCompiler(info, max_threads=1)
            return self._compiler

    def _compile(self, spec: StructuredOutput) -> Any:
        compiler = self._xgrammar()
        kind = spec.kind
        try:
            if kind == "json_object":
                return compiler.compile_builtin_json_grammar()
            if kind == "json_schema":
                # compact separators: a model cannot spend its tokens on whitespace
                return compiler.compile_json_schema(
                    spec.spec, any_whitespace=False, separators=(",", ":")
                )
            if kind == "regex":
                return compiler.compile_regex(spec.spec)
            if kind == "choice":
                return compiler.compile_grammar(_choice_grammar(json.loads(spec.spec)))
            if kind == "structural_tag":
                return compiler.compile_structural_tag(spec.spec)
            return compiler.compile_grammar(spec.spec)
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError subclasses
            reason = str(exc).strip().splitlines()
            detail = reason[-1] if reason else type(exc).__name__
            raise GrammarError(f"the {kind} cannot be compiled: {detail}"[:500]) from None


def _choice_grammar(choices: list[str]) -> str:
    """An EBNF grammar whose only sentences are the choices, as JSON-escaped literals."""
    alternatives = " | ".join(json.dumps(choice) for choice in choices)
    return f"root ::= {alternatives}"


def _control_byte_ban(info: Any, vocab_size: int, stop_token_ids: list[int]) -> torch.Tensor:
    """``[words]`` int32, every bit set but those of the tokens holding a byte < 0x20."""
    bits = np.ones(-(-vocab_size // 32) * 32, dtype=bool)
    for token_id, text in enumerate(info.decoded_vocab[:vocab_size]):
        if any(byte < 0x20 for byte in text):
            bits[token_id] = False
    bits[stop_token_ids] = True
    packed = np.packbits(bits, bitorder="little").view(np.int32)
    return torch.from_numpy(packed.copy())


def _tokenizer_info(tokenizer: Tokenizer, vocab_size: int, stop_token_ids: list[int]) -> Any:
    import xgrammar as xgr

    backend = tokenizer.backend
    vocab = backend.get_vocab(with_added_tokens=True)
    size = max(vocab_size, max(vocab.values()) + 1)
    encoded = [""] * size
    for token, index in vocab.items():
        encoded[index] = token
    # how the vocabulary encodes bytes (byte-level BPE, SentencePiece byte fallback, raw),
    # read from tokenizer.json as xgrammar's own from_huggingface reads it
    metadata = xgr.TokenizerInfo._detect_metadata_from_hf(backend.to_str())
    return xgr.TokenizerInfo(
        encoded[:vocab_size] if size > vocab_size else encoded,
        vocab_type=metadata["vocab_type"],
        vocab_size=vocab_size,
        stop_token_ids=stop_token_ids,
        add_prefix_space=metadata["add_prefix_space"],
    )
