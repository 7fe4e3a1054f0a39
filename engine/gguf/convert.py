"""A GGUF file as an HF-format directory, made once and reused while the file is unchanged.

`prepare_gguf(path, cache_dir)` writes `config.json`, `tokenizer.json`, `tokenizer_config.json`
(with the chat template), `generation_config.json`, the tensor table `gguf_tensors.json` and a
`gguf_source.json` stamp into `cache_dir/<file stem>/`, next to a symlink `model.gguf` to the
file. Reading the metadata (the vocabulary above all) is the slow part, so it happens here
once; the loader maps the weights through the link with the table and dequantizes them at load
time, so the directory costs megabytes, not a float copy of the model.
The directory is built in a staging folder and renamed into place, so a crash never leaves a
half-written one; a changed source file (size or mtime) is converted again.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from engine.errors import LoaderError
from engine.gguf.reader import GGUFCheckpoint, GGUFWeights
from engine.gguf.tokenizer import tokenizer_files

STAMP_FILE = "gguf_source.json"
TABLE_FILE = "gguf_tensors.json"
WEIGHTS_LINK = "model.gguf"
FORMAT_VERSION = 1  # bump when the files written here change meaning


def _stamp(source: Path) -> dict[str, Any]:
    stat = source.stat()
    return {
        "source": str(source),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "format": FORMAT_VERSION,
    }


def _is_current(target: Path, stamp: dict[str, Any]) -> bool:
    try:
        written = json.loads((target / STAMP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return written == stamp and (target / WEIGHTS_LINK).exists() and (target / TABLE_FILE).is_file()


def view_dir(path: str | Path, cache_dir: str | Path) -> Path:
    """Where `prepare_gguf` puts the view of the GGUF file `path`."""
    return Path(cache_dir).expanduser() / Path(path).name.removesuffix(".gguf")


def is_prepared(path: str | Path, cache_dir: str | Path) -> bool:
    """True when `prepare_gguf(path, cache_dir)` would find its view current (no work)."""
    source = Path(path).expanduser().resolve()
    return source.is_file() and _is_current(view_dir(source, cache_dir), _stamp(source))


class _StepBar:
    """A tqdm bar over the conversion's steps whose clock keeps ticking during a long one
    (reading the metadata is one call of several seconds)."""

    def __init__(self, name: str, steps: int) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=steps, desc=f"Converting {name}", unit="step")
        self._done = threading.Event()
        self._ticker = threading.Thread(target=self._tick, daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        while not self._done.wait(1.0):
            self._bar.refresh()

    def step(self, what: str) -> None:
        self._bar.set_postfix_str(what, refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        self._done.set()
        self._ticker.join()
        self._bar.close()


def prepare_gguf(path: str | Path, cache_dir: str | Path, *, progress: bool = False) -> Path:
    """The HF-format directory for the GGUF file `path` (see the module docstring); with
    `progress`, a bar over the conversion's steps when there is one to do."""
    source = Path(path).expanduser().resolve()
    if not source.is_file():
        raise LoaderError(f"GGUF file {str(source)!r} does not exist")
    stem = source.name.removesuffix(".gguf")
    target = view_dir(source, cache_dir)
    stamp = _stamp(source)
    if _is_current(target, stamp):
        return target
    bar = _StepBar(source.name, 4) if progress else None
    try:
        checkpoint = GGUFCheckpoint(source)  # the slow part: the metadata, vocabulary above all
        if bar is not None:
            bar.step("metadata read")
        files = {"config.json": json.dumps(checkpoint.hf_config(), indent=2)}
        files.update(tokenizer_files(checkpoint.metadata))
        if bar is not None:
            bar.step("tokenizer")
        files[TABLE_FILE] = json.dumps(checkpoint.tensor_table())
        files[STAMP_FILE] = json.dumps(stamp, indent=2)
        if bar is not None:
            bar.step("tensor table")
        _write_view(source, target, stem, stamp, files)
        if bar is not None:
            bar.step("written")
    finally:
        if bar is not None:
            bar.close()
    return target


def _write_view(
    source: Path, target: Path, stem: str, stamp: dict[str, Any], files: dict[str, str]
) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{stem}-", dir=target.parent))
    try:
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
        (staging / WEIGHTS_LINK).symlink_to(source)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except OSError as exc:
        if not _is_current(target, stamp):  # a concurrent writer may have won the race
            raise LoaderError(f"cannot write the GGUF view of {source} in {target}: {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def view_weights(path: Path) -> GGUFWeights | None:
    """The GGUF weights of a directory `prepare_gguf` made; None for any other directory."""
    link = path / WEIGHTS_LINK
    if not link.is_symlink() and not link.exists():
        return None
    if not link.exists():
        raise LoaderError(f"{link} points to {link.readlink()}, which no longer exists")
    try:
        table = json.loads((path / TABLE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LoaderError(f"{path / TABLE_FILE} is missing or unreadable: {exc}") from exc
    return GGUFWeights(link, table)
