"""The byte-table detokenizer streams exactly what `DecodeStream` does, and the tokenizers it
cannot serve keep `DecodeStream`."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tiny_checkpoint import write_tiny_checkpoint

from engine.core.detokenizer import ByteDetokenizer, StreamDetokenizer, make_detokenizer
from engine.gguf.bundled import find_bundled_model
from engine.gguf.convert import prepare_gguf
from engine.token_bytes import REPLACEMENT_CHAR, TokenBytes
from engine.tokenizer import Tokenizer

TEXTS = ["café 🙂 日本語", "naïve façade — “quotes” ✓", "emoji 👩‍👩‍👧 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "plain ascii"]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tokenizer]:
    tiny = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "qwen3", arch="qwen3")
    smollm2 = prepare_gguf(find_bundled_model(), tmp_path_factory.mktemp("gguf"))
    return {"tiny": Tokenizer(tiny), "smollm2": Tokenizer(smollm2)}


def _sequences(tokenizer: Tokenizer, count: int) -> list[list[int]]:
    """Random ids weighted towards the hard ones: bytes that do not end a character,
    special tokens, ids past the vocabulary; and real multi-byte text."""
    table = tokenizer.token_bytes
    assert table is not None
    size = len(table.data)
    partial = [i for i, text in enumerate(table.texts) if text is None]
    special = [i for i in range(size) if tokenizer.is_special(i)]
    assert partial and special
    draw = random.Random(7)
    sequences = [tokenizer.encode(text, add_special_tokens=False) for text in TEXTS]
    for _ in range(count):
        pools = [range(size), partial, special, range(size, size + 64)]
        weights = [6, 3, 1, 0.2]
        sequences.append(
            [draw.choice(draw.choices(pools, weights)[0]) for _ in range(draw.randint(1, 40))]
        )
    return sequences


@pytest.mark.parametrize("name", ["tiny", "smollm2"])
def test_byte_table_streams_what_decode_stream_streams(
    tokenizers: dict[str, Tokenizer], name: str
) -> None:
    tokenizer = tokenizers[name]
    prompt = tokenizer.encode("Say something:", add_special_tokens=False)
    for ids in _sequences(tokenizer, 400):
        table_detok = make_detokenizer(tokenizer, prompt)
        assert isinstance(table_detok, ByteDetokenizer)
        stream = StreamDetokenizer(tokenizer.backend, prompt[-5:])
        assert [table_detok.push(t) for t in ids] == [stream.push(t) for t in ids], ids


@pytest.mark.parametrize("name", ["tiny", "smollm2"])
def test_byte_table_decodes_every_token_as_the_tokenizer(
    tokenizers: dict[str, Tokenizer], name: str
) -> None:
    tokenizer = tokenizers[name]
    table = tokenizer.token_bytes
    assert table is not None
    ids = list(range(len(table.data)))
    decoded = tokenizer.backend.decode_batch([[i] for i in ids], skip_special_tokens=True)
    assert [table.decode([i]) for i in ids] == decoded


def test_multibyte_text_streams_whole_characters(tokenizers: dict[str, Tokenizer]) -> None:
    tokenizer = tokenizers["smollm2"]
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        detok = make_detokenizer(tokenizer, tokenizer.encode("hi", add_special_tokens=False))
        pieces = [detok.push(t) for t in ids]
        assert REPLACEMENT_CHAR not in "".join(pieces)
        assert "".join(pieces) == text


def _metaspace_tokenizer(directory: Path) -> Path:
    """A SentencePiece-style tokenizer (Metaspace decoder): a token's text depends on where it
    stands, so no byte table applies."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    backend = HFTokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "</s>"])
    backend.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 4, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    backend.save(str(directory / "tokenizer.json"))
    return directory


def test_other_decoders_keep_decode_stream(tmp_path: Path) -> None:
    tokenizer = Tokenizer(_metaspace_tokenizer(tmp_path / "sp"))
    assert tokenizer.token_bytes is None
    prompt = tokenizer.encode("the fox", add_special_tokens=False)
    detok = make_detokenizer(tokenizer, prompt)
    assert isinstance(detok, StreamDetokenizer)
    ids = tokenizer.encode("jumps over the dog", add_special_tokens=False)
    assert "".join(detok.push(t) for t in ids) == " jumps over the dog"


def test_a_table_that_disagrees_with_the_tokenizer_is_not_trusted(
    tokenizers: dict[str, Tokenizer],
) -> None:
    tokenizer = tokenizers["tiny"]
    table = tokenizer.token_bytes
    assert table is not None and table._agrees_with(tokenizer.backend)
    special = next(i for i in range(len(table.data)) if tokenizer.is_special(i))
    data = list(table.data)
    data[special] = b"<s>"  # a special token that would stream its text
    wrong = TokenBytes(data, list(table.texts))
    assert not wrong._agrees_with(tokenizer.backend)


def test_added_tokens_decode_through_the_byte_level_decoder(
    tokenizers: dict[str, Tokenizer],
) -> None:
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HFTokenizer

    backend = HFTokenizer.from_str(tokenizers["tiny"].backend.to_str())
    # stand-ins ("Ġ" is a space) and a character outside the alphabet (a plain space)
    backend.add_tokens(
        [AddedToken("ĠĠmark", normalized=False), AddedToken("é x", normalized=False)]
    )
    table = TokenBytes.build(backend)
    assert table is not None
    for content, text in [("ĠĠmark", "  mark"), ("é x", "é x")]:
        token_id = backend.token_to_id(content)
        assert backend.decode([token_id]) == text == table.decode([token_id])
