"""Open a GGUF file and read its metadata, turning every failure into a named error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf

from common.errors import ModelNotFoundError, NotGGUFError

GGUF_MAGIC = b"GGUF"


def open_gguf(path: str | Path) -> gguf.GGUFReader:
    """A memory-mapped reader for `path`; raises ModelNotFoundError or NotGGUFError."""
    path = Path(path)
    if not path.is_file():
        raise ModelNotFoundError(f"model file not found: {path}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise NotGGUFError(f"{path} is not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        return gguf.GGUFReader(path, "r")
    except Exception as e:  # the reader raises ValueError, struct.error, IndexError...
        raise NotGGUFError(f"{path}: malformed GGUF file ({type(e).__name__}: {e})") from e


def read_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """Every key/value of the header as plain Python values (str, int, float, bool, list)."""
    return {name: field.contents() for name, field in reader.fields.items()}
