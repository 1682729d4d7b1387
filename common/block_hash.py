"""The identity of a run of whole blocks of tokens: a hash of a block's tokens chained
through every block before it, rooted in a scope (the tenant, and for KV the model and its
KV dtype: engine/kv_files/chain.py). Workers share and name KV blocks by it; the gateway
finds the session a prompt continues by it (gateway/session_find.py). One function, so
both hash a prompt's blocks alike."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def chain_hash(previous: bytes, token_ids: Sequence[int]) -> bytes:
    """The identity of a full block: its tokens and, through `previous`, every token before
    it (the first block's `previous` is the scope's root)."""
    h = hashlib.blake2b(previous, digest_size=16)
    h.update(b"".join(t.to_bytes(4, "little") for t in token_ids))
    return h.digest()


def scope_hash(root: str, tenant: str) -> bytes:
    """The root of a tenant's hash chains: tenants never share one."""
    return hashlib.blake2b(f"{root}\0{tenant}".encode(), digest_size=16).digest()


def prefix_hashes(root: bytes, token_ids: Sequence[int], block: int) -> list[bytes]:
    """The chain hash after each whole block of `block` tokens, in order."""
    hashes, previous = [], root
    for start in range(0, len(token_ids) - block + 1, block):
        previous = chain_hash(previous, token_ids[start : start + block])
        hashes.append(previous)
    return hashes
