"""Grammar engines side by side: ``python -m bench.grammar [--rounds N]``.

Measures what structured outputs cost the engine with the bundled SmolLM2 tokenizer (49,152
tokens, byte-level BPE) for xgrammar, llguidance and outlines-core, whichever are installed:

- the tokenizer set-up (once per engine),
- the compile time of one realistic JSON schema (nested objects, arrays, enums, number bounds,
  20 fields; caches off, a fresh compile each time),
- the mask cost per generated token at batch 1 and 16: fill the bitmask of every row, copy it
  into the ``[batch, vocab]`` float32 logits with the engine's own masked fill
  (``engine.layers.token_mask``), and advance every matcher by the token, walking a valid
  instance of the schema token by token.

The engines take turns in every round (the box is shared and noisy) and the medians over the
rounds are printed as one JSON line, with the CPU model and the load average.
"""

from __future__ import annotations

import abc
import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.machine import cpu_model

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "status": {"enum": ["pending", "paid", "shipped", "delivered", "cancelled"]},
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "email": {"type": "string"},
                "age": {"type": "integer", "minimum": 18, "maximum": 120},
                "tier": {"enum": ["free", "pro", "enterprise"]},
            },
            "required": ["name", "email", "age", "tier"],
            "additionalProperties": False,
        },
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 8,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                    "unit_price": {"type": "number", "minimum": 0, "maximum": 10000},
                },
                "required": ["sku", "quantity", "unit_price"],
                "additionalProperties": False,
            },
        },
        "total": {"type": "number", "minimum": 0},
        "currency": {"enum": ["USD", "EUR", "GBP", "JPY"]},
        "shipping": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "postal_code": {"type": "string"},
                "country": {"type": "string"},
                "express": {"type": "boolean"},
            },
            "required": ["street", "city", "postal_code", "country", "express"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "gift": {"type": "boolean"},
    },
    "required": [
        "order_id",
        "status",
        "customer",
        "items",
        "total",
        "currency",
        "shipping",
        "tags",
        "gift",
    ],
    "additionalProperties": False,
}
INSTANCE: dict[str, Any] = {
    "order_id": "A-10293",
    "status": "shipped",
    "customer": {"name": "Ada Lovelace", "email": "ada@example.com", "age": 36, "tier": "pro"},
    "items": [
        {"sku": "KB-01", "quantity": 2, "unit_price": 49.5},
        {"sku": "MS-7", "quantity": 1, "unit_price": 19.99},
    ],
    "total": 118.99,
    "currency": "EUR",
    "shipping": {
        "street": "12 Analytical Row",
        "city": "London",
        "postal_code": "N1 9GU",
        "country": "GB",
        "express": True,
    },
    "tags": ["gift-wrap", "fragile"],
    "gift": False,
}


def smollm2_dir(download_dir: str | None) -> Path:
    from engine import find_bundled_model
    from engine.loader import resolve_model_path

    return resolve_model_path(find_bundled_model(), download_dir)


class Backend(abc.ABC):
    """One grammar engine behind three calls: compile, new matchers, one masked step."""

    name: str

    @abc.abstractmethod
    def compile(self) -> Any: ...

    @abc.abstractmethod
    def matchers(self, compiled: Any, count: int) -> list[Any]: ...

    @abc.abstractmethod
    def fill(self, matchers: list[Any], bitmask: torch.Tensor) -> None: ...

    def fill_parallel(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        """The engine's own multi-threaded batch fill, where it has one."""
        self.fill(matchers, bitmask)

    @abc.abstractmethod
    def accept(self, matchers: list[Any], token: int) -> None: ...


class XGrammar(Backend):
    name = "xgrammar"

    def __init__(self, model_dir: Path, vocab_size: int, eos: list[int]) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        vocab = json.loads((model_dir / "tokenizer.json").read_text())
        ordered = _ordered_vocab(vocab)
        self.info = xgr.TokenizerInfo(
            ordered, xgr.VocabType.BYTE_LEVEL, vocab_size=vocab_size, stop_token_ids=eos
        )
        self.batch = xgr.BatchGrammarMatcher()

    def compile(self) -> Any:
        compiler = self.xgr.GrammarCompiler(self.info, cache_enabled=False)
        return compiler.compile_json_schema(
            json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":")
        )

    def matchers(self, compiled: Any, count: int) -> list[Any]:
        return [self.xgr.GrammarMatcher(compiled) for _ in range(count)]

    def fill(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        for row, matcher in enumerate(matchers):
            matcher.fill_next_token_bitmask(bitmask, row)

    def fill_parallel(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        self.batch.batch_fill_next_token_bitmask(matchers, bitmask)

    def accept(self, matchers: list[Any], token: int) -> None:
        for matcher in matchers:
            assert matcher.accept_token(token)


class LLGuidance(Backend):
    name = "llguidance"

    def __init__(self, model_dir: Path, vocab_size: int, eos: list[int]) -> None:
        import llguidance

        self.ll = llguidance
        text = (model_dir / "tokenizer.json").read_text()
        self.tokenizer = llguidance.LLTokenizer(text, n_vocab=vocab_size, eos_token=eos)
        self.executor = llguidance.LLExecutor()

    def compile(self) -> Any:
        grammar = self.ll.LLMatcher.grammar_from_json_schema(
            json.dumps(SCHEMA), defaults={"whitespace_flexible": False}
        )
        matcher = self.ll.LLMatcher(self.tokenizer, grammar)  # the grammar is built here
        assert not matcher.is_error(), matcher.get_error()
        return grammar

    def matchers(self, compiled: Any, count: int) -> list[Any]:
        return [self.ll.LLMatcher(self.tokenizer, compiled) for _ in range(count)]

    def fill(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        from llguidance.torch import fill_next_token_bitmask

        for row, matcher in enumerate(matchers):
            fill_next_token_bitmask(matcher, bitmask, row)

    def fill_parallel(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        from llguidance.torch import fill_next_token_bitmask_par

        pairs = [(m, i) for i, m in enumerate(matchers)]
        fill_next_token_bitmask_par(self.executor, pairs, bitmask)

    def accept(self, matchers: list[Any], token: int) -> None:
        for matcher in matchers:
            assert matcher.consume_token(token), matcher.get_error()


class OutlinesCore(Backend):
    name = "outlines-core"

    def __init__(self, model_dir: Path, vocab_size: int, eos: list[int]) -> None:
        import outlines_core

        self.oc = outlines_core
        vocab = json.loads((model_dir / "tokenizer.json").read_text())
        decoder = _byte_decoder()
        tokens: dict[bytes, list[int]] = {}
        special = {t["id"] for t in vocab.get("added_tokens", []) if t.get("special")}
        for text, token_id in _vocab_items(vocab):
            if token_id in special or token_id in eos:
                continue
            raw = bytes(decoder[c] for c in text) if all(c in decoder for c in text) else None
            if raw is not None:
                tokens.setdefault(raw, []).append(token_id)
        self.vocabulary = outlines_core.Vocabulary(eos[0], tokens)

    def compile(self) -> Any:
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(SCHEMA))
        return self.oc.Index(regex, self.vocabulary)

    def matchers(self, compiled: Any, count: int) -> list[Any]:
        return [self.oc.Guide(compiled) for _ in range(count)]

    def fill(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        for row, guide in enumerate(matchers):
            guide.write_mask_into(bitmask[row].data_ptr(), bitmask[row].numel(), 4)

    def accept(self, matchers: list[Any], token: int) -> None:
        for guide in matchers:
            if not guide.is_finished():  # its final state takes no EOS
                guide.advance(token)


def _vocab_items(vocab: dict[str, Any]) -> list[tuple[str, int]]:
    items = list(vocab["model"]["vocab"].items())
    items += [(t["content"], t["id"]) for t in vocab.get("added_tokens", [])]
    return items


def _ordered_vocab(vocab: dict[str, Any]) -> list[str]:
    items = _vocab_items(vocab)
    ordered = [""] * (max(i for _, i in items) + 1)
    for text, token_id in items:
        ordered[token_id] = text
    return ordered


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: printable stand-ins for the 256 byte values."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = list(keep), 0
    for byte in range(256):
        if byte not in keep:
            keep.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def masked_steps(
    backend: Backend,
    compiled: Any,
    tokens: list[int],
    batch: int,
    vocab_size: int,
    parallel: bool = False,
) -> dict[str, float]:
    """Median seconds per generated token of: filling every row's mask (``fill``), applying
    it to the logits (``apply``), accepting the token in every matcher (``accept``), and the
    three together (``step``)."""
    from engine.layers.token_mask import TokenMask

    matchers = backend.matchers(compiled, batch)
    bitmask = torch.zeros(batch, (vocab_size + 31) // 32, dtype=torch.int32)
    logits = torch.randn(batch, vocab_size)
    rows = torch.arange(batch)
    mask = TokenMask()
    fill = backend.fill_parallel if parallel else backend.fill
    parts: dict[str, list[float]] = {"fill": [], "apply": [], "accept": [], "step": []}
    for token in tokens:
        start = time.perf_counter()
        fill(matchers, bitmask)
        filled = time.perf_counter()
        mask.apply(logits, rows, bitmask)
        applied = time.perf_counter()
        backend.accept(matchers, token)
        end = time.perf_counter()
        parts["fill"].append(filled - start)
        parts["apply"].append(applied - filled)
        parts["accept"].append(end - applied)
        parts["step"].append(end - start)
    return {name: statistics.median(values) for name, values in parts.items()}


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--download-dir", default=None)
    parser.add_argument("--engines", default="xgrammar,llguidance,outlines-core")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model_dir = smollm2_dir(args.download_dir)
    from engine.loader import load_model_args
    from engine.tokenizer import Tokenizer

    tokenizer = Tokenizer(model_dir)
    vocab_size = load_model_args(model_dir).vocab_size
    eos = sorted(tokenizer.eos_token_ids)
    text = json.dumps(INSTANCE, separators=(",", ":"))
    tokens = tokenizer.encode(text, add_special_tokens=False) + eos[:1]
    kinds = {"xgrammar": XGrammar, "llguidance": LLGuidance, "outlines-core": OutlinesCore}
    backends: list[Backend] = []
    setup: dict[str, float] = {}
    for name in args.engines.split(","):
        try:
            seconds, backend = timed(lambda kind=kinds[name]: kind(model_dir, vocab_size, eos))
        except ImportError:
            continue
        setup[name] = seconds
        backends.append(backend)
    compile_s: dict[str, list[float]] = {b.name: [] for b in backends}
    runs = {"batch1": (1, False), "batch16": (16, False), "batch16_parallel": (16, True)}
    steps: dict[str, dict[str, list[dict[str, float]]]] = {
        b.name: {run: [] for run in runs} for b in backends
    }
    errors: dict[str, str] = {}
    for _ in range(args.rounds):
        for backend in backends:
            if backend.name in errors:
                continue
            try:
                seconds, compiled = timed(backend.compile)
                compile_s[backend.name].append(seconds)
                for run, (batch, parallel) in runs.items():
                    parts = masked_steps(backend, compiled, tokens, batch, vocab_size, parallel)
                    steps[backend.name][run].append(parts)
            except Exception as exc:  # an engine that cannot do this schema says so
                errors[backend.name] = f"{type(exc).__name__}: {exc}"[:300]
    median = statistics.median

    def summary(per_round: list[dict[str, float]]) -> dict[str, float]:
        return {k: round(1e6 * median(r[k] for r in per_round), 1) for k in per_round[0]}

    result = {
        "cpu": cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_1m": os.getloadavg()[0],
        "vocab_size": vocab_size,
        "instance_tokens": len(tokens),
        "rounds": args.rounds,
        "tokenizer_setup_s": {k: round(v, 3) for k, v in setup.items()},
        "compile_ms": {k: round(1e3 * median(v), 2) for k, v in compile_s.items() if v},
        "mask_us_per_token": {
            name: {run: summary(r) for run, r in per.items() if r} for name, per in steps.items()
        },
        "errors": errors,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
