"""A model's fingerprint: the digest that names the KV it computes (spill files, prefix
blocks), so that KV is never read by a model it was not computed by.

Hashing every byte of a large file is seconds of every worker's start, so the digest is
kept in `WARMFLEET_FINGERPRINT_DIR` under the file's identity (path, device, inode, size,
modification and change times). A file changed less than RACY_S before it is hashed is
not kept: a second change within its timestamps' grain could leave them alike (git's
"racy" files)."""

from __future__ import annotations

import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from engine.text.gguf_file import GGUFFile, GGUFTensor
from engine.text.model_config import ModelConfig

RECIPE = 2  # the digest's recipe: a new one makes every kept digest a miss
RACY_S = 2.0


def fingerprint(reader: GGUFFile, config: ModelConfig, path: Path | None = None) -> str:
    """The digest of the config and every tensor of `reader`, read from the cache when
    `path` (the file `reader` maps) is given and its identity was hashed before."""
    key = _identity(path, config) if path is not None else None
    kept = _cache_dir() / key if key else None
    if kept is not None:
        try:
            digest = kept.read_text().strip()
            if len(digest) == 32 and all(c in "0123456789abcdef" for c in digest):
                return digest
        except OSError:
            pass  # not hashed before (or unreadable): hashed now
    digest = tensors_digest(reader, config)
    if kept is not None:
        _keep(kept, digest)
    return digest


def tensors_digest(reader: GGUFFile, config: ModelConfig) -> str:
    """A digest of the config and every tensor's name, type, shape and bytes. Hashing the
    bytes was most of a load (4.9 of 6.1 s for a 3.3 GB file, one thread): each tensor's
    are hashed on their own, on every core (hashlib lets go of the GIL), straight from the
    map, and their digests joined in the file's order."""

    def tensor_digest(t: GGUFTensor) -> bytes:
        data = np.ascontiguousarray(t.data).reshape(-1).view(np.uint8).data  # no copy
        return hashlib.blake2b(data, digest_size=16).digest()

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        digests = list(pool.map(tensor_digest, reader.tensors))
    digest = hashlib.blake2b(repr(config).encode(), digest_size=16)
    for t, tensor in zip(reader.tensors, digests, strict=True):
        digest.update(f"{t.name}:{t.tensor_type.name}:{list(t.shape)}".encode())
        digest.update(tensor)
    return digest.hexdigest()


def _cache_dir() -> Path:
    configured = os.environ.get("WARMFLEET_FINGERPRINT_DIR")
    return Path(configured) if configured else Path.home() / ".cache/warmfleet/fingerprints"


def _identity(path: Path, config: ModelConfig) -> str | None:
    """The cache file's name for the file at `path` as it is now; None when it changed
    too recently to be kept."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if time.time() - max(st.st_mtime, st.st_ctime) < RACY_S:
        return None
    where = (RECIPE, os.path.realpath(path), st.st_dev, st.st_ino)
    who = (*where, st.st_size, st.st_mtime_ns, st.st_ctime_ns, repr(config))
    return hashlib.blake2b(repr(who).encode(), digest_size=16).hexdigest()


def _keep(kept: Path, digest: str) -> None:
    """Write the digest whole or not at all; a cache that cannot be written costs the
    next start a hash, nothing more."""
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        part = kept.with_name(f"{kept.name}.{os.getpid()}.part")
        part.write_text(digest + "\n")
        os.replace(part, kept)
    except OSError:
        pass
