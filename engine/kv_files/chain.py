"""The root of a KV block's hash chain (common/block_hash.py): the model, and the KV dtype,
beside the tenant. The pool shares blocks by the chain, block files are named by it, and
spill files list it."""

from __future__ import annotations

from typing import Any

from engine.kv_files.kv_dtypes import kv_name


def kv_root(fingerprint: str, kv_dtype: Any) -> str:
    """What a block's chain is rooted in besides the tenant: the model, and the KV dtype
    where it is not float32, so that blocks in different dtypes never pass for each other
    (in a pool, on disk, or across a fleet's workers)."""
    name = kv_name(kv_dtype)
    return fingerprint if name == "float32" else f"{fingerprint}/kv={name}"
