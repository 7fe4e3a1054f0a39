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


def prepare_gguf(path: str | Path, cache_dir: str | Path) -> Path:
    """The HF-format directory for the GGUF file `path` (see the module docstring)."""
    source = Path(path).expanduser().resolve()
    if not source.is_file():
        raise LoaderError(f"GGUF file {str(source)!r} does not exist")
    stem = source.name.removesuffix(".gguf")
    target = Path(cache_dir).expanduser() / stem
    stamp = _stamp(source)
    if _is_current(target, stamp):
        return target
    checkpoint = GGUFCheckpoint(source)
    files = {
        "config.json": json.dumps(checkpoint.hf_config(), indent=2),
        **tokenizer_files(checkpoint.metadata),
        TABLE_FILE: json.dumps(checkpoint.tensor_table()),
        STAMP_FILE: json.dumps(stamp, indent=2),
    }
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
    return target


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
