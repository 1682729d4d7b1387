"""The identity of a full KV block: a hash of its tokens chained through every block before
it, rooted in the model, the KV dtype and the tenant. The pool shares blocks by it, block
files are named by it, and spill files list it."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from engine.kv_files.kv_dtypes import kv_name


def chain_hash(previous: bytes, token_ids: Sequence[int]) -> bytes:
    """The identity of a full block: its tokens and, through `previous`, every token before
    it (the first block's `previous` is the scope: model fingerprint and tenant)."""
    h = hashlib.blake2b(previous, digest_size=16)
    h.update(b"".join(t.to_bytes(4, "little") for t in token_ids))
    return h.digest()


def scope_hash(fingerprint: str, tenant: str) -> bytes:
    """The root of a tenant's hash chains: tenants never share a block."""
    return hashlib.blake2b(f"{fingerprint}\0{tenant}".encode(), digest_size=16).digest()


def kv_root(fingerprint: str, kv_dtype: Any) -> str:
    """What a block's chain is rooted in besides the tenant: the model, and the KV dtype
    where it is not float32, so that blocks in different dtypes never pass for each other
    (in a pool, on disk, or across a fleet's workers)."""
    name = kv_name(kv_dtype)
    return fingerprint if name == "float32" else f"{fingerprint}/kv={name}"
