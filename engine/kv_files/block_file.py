"""KV blocks on disk, one file per full block, named by the block's hash (its tokens, every
token before it, the model and the tenant: see chain.chain_hash). A block shared by many
sessions (a system prompt) is written once; sessions' spill files list the blocks they use.

Layout: a kv_frame with magic b"WFKB", its JSON header holding the model fingerprint, the
hash of the block before it and this block's token ids; keys and values are each [layers,
kv_heads, block, head_dim]. Reading checks everything, the hash chain included, so a block
of another model, tenant or prefix is refused, never used.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from common.block_hash import chain_hash
from common.errors import SpillFileError
from engine.kv_files.kv_frame import FrameRead, checked_frame, read_into, write_frame

MAGIC = b"WFKB"
VERSION = 1
KIND = ("block", MAGIC, VERSION)
MAX_HEADER_BYTES = 1 << 20
GRACE_S = 120.0  # an unlisted block younger than this may belong to a write in flight


def block_path(directory: Path, h: bytes) -> Path:
    return directory / f"{h.hex()}.wfkb"


def write_block(
    directory: Path, fingerprint: str, previous: bytes, token_ids: list[int], k: Any, v: Any
) -> int:
    """Write the block unless it is there already (then only its time is refreshed, so
    that a sweep does not take it meanwhile); the bytes newly written."""
    h = chain_hash(previous, token_ids)
    path = block_path(directory, h)
    try:
        os.utime(path)
        return 0
    except FileNotFoundError:
        pass
    write_frame(path, MAGIC, VERSION, {"fingerprint": fingerprint, "previous": previous.hex(),
                                       "token_ids": token_ids}, k, v)  # fmt: skip
    return path.stat().st_size


def read_block(
    directory: Path,
    fingerprint: str,
    previous: bytes,
    token_ids: list[int],
    shape: list[int],
    out: Sequence[np.ndarray],
) -> None:
    """Read the keys and values ([layers, kv_heads, block, head_dim] each) of the block
    holding `token_ids` after `previous` straight into `out`: contiguous arrays of the
    expected dtype whose bytes one after another are the keys', then the values' (a
    session's arrays' rows, a pool's blocks). A missing block or one failing any check
    raises SpillFileError (a bad file is deleted); `out` then holds nothing usable."""
    path = block_path(directory, chain_hash(previous, token_ids))
    name = str(path)
    try:
        h = read_into(path, KIND, MAX_HEADER_BYTES, shape, out)
        _check_header(h, name, fingerprint, previous, token_ids)
    except FileNotFoundError as e:
        raise SpillFileError(name, "a block it lists is missing") from e
    except SpillFileError:
        path.unlink(missing_ok=True)
        raise


def read_whole(
    frame: FrameRead | None,
    name: str,
    fingerprint: str,
    previous: bytes,
    token_ids: list[int],
    shape: list[int],
    dtype: np.dtype[Any],
) -> bool:
    """Whether a block file read whole elsewhere (`frame`: None where that reader found
    it missing or unreadable) passed every check of read_block; where not, read_block
    reads it again and says why."""
    if frame is None:
        return False
    try:
        h = checked_frame(frame, KIND, MAX_HEADER_BYTES, shape, dtype, name)
        _check_header(h, name, fingerprint, previous, token_ids)
    except SpillFileError:
        return False
    return True


def _check_header(
    h: dict[str, Any], name: str, fingerprint: str, previous: bytes, token_ids: list[int]
) -> None:
    if h.get("fingerprint") != fingerprint:
        raise SpillFileError(name, "written by another model (fingerprint differs)")
    if h.get("previous") != previous.hex() or h.get("token_ids") != token_ids:
        raise SpillFileError(name, "holds another prefix (a foreign block)")


def advise(directory: Path, hashes: Sequence[bytes]) -> None:
    """Ask the kernel to start reading these blocks' files now, all at once (a deep queue
    reads a cold disk faster than a few readers' requests one by one); a no-op where
    posix_fadvise is missing (macOS) or a file is."""
    if not hasattr(os, "posix_fadvise"):
        return
    for h in hashes:
        with contextlib.suppress(OSError):
            fd = os.open(block_path(directory, h), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)


def sweep(directory: Path, listed: set[str], grace_s: float = GRACE_S) -> int:
    """Delete the block files no spill file lists (`listed`: hashes in hex), except young
    ones a write in flight may be about to list; the bytes freed."""
    freed = 0
    cutoff = time.time() - grace_s
    for path in directory.glob("*.wfkb"):
        if path.stem in listed:
            continue
        try:
            st = path.stat()
            if st.st_mtime < cutoff:
                path.unlink()
                freed += st.st_size
        except FileNotFoundError:
            pass
    return freed


def usage(directory: Path) -> int:
    """Bytes of all block files (each shared block once)."""
    total = 0
    for path in directory.glob("*.wfkb"):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total
