"""A spill file's name and header (engine/kv_files/spill_file.py): what the kvstore reads
of a session's file without its payload."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.kv_files.kv_frame import PREFIX

MAGIC = b"WFKV"
VERSION = 3  # 2: the header names the session (key); 3: full blocks in block files
LAYOUT = "k,v;layers,kv_heads,tokens,head_dim"
MAX_HEADER_BYTES = 16 << 20


def spill_path(directory: Path, key: str) -> Path:
    """A fixed, filesystem-safe name for a session key (tenant/session id)."""
    return directory / f"{hashlib.sha256(key.encode()).hexdigest()[:40]}.wfkv"


@dataclass(frozen=True, slots=True)
class FileSummary:
    key: str
    size: int  # bytes the write added: its own file and the blocks not there before
    mtime_ns: int
    num_tokens: int
    blocks: tuple[str, ...] = ()  # hashes (hex) of the block files it lists


def read_head(path: Path) -> tuple[dict[str, Any], os.stat_result] | None:
    """A spill file's header (unchecked but for its frame) and its stat; None when the file
    is gone or its header cannot be read."""
    try:
        with path.open("rb") as f:
            st = os.fstat(f.fileno())
            magic, version, header_len = PREFIX.unpack(f.read(PREFIX.size))
            if magic != MAGIC or version != VERSION or header_len > MAX_HEADER_BYTES:
                return None
            h = json.loads(f.read(header_len))
        return (h, st) if isinstance(h, dict) else None
    except (OSError, ValueError, struct.error):
        return None


def read_summary(path: Path) -> FileSummary | None:
    """The session a spill file holds, from its header alone (no payload check); None when
    the file is gone or its header cannot be read."""
    head = read_head(path)
    if head is None:
        return None
    h, st = head
    try:
        n, blocks = len(h["token_ids"]), tuple(h["blocks"])
        return FileSummary(str(h["key"]), st.st_size, st.st_mtime_ns, n, blocks)
    except (KeyError, TypeError):
        return None
