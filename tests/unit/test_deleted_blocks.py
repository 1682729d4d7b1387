"""DeleteSession forgets a session's blocks that nothing else holds: a later prompt with the
deleted session's history finds none of them (it is recomputed), while blocks another
session shares stay found; a session merely released keeps its blocks findable."""

from __future__ import annotations

import numpy as np

from engine.kv.kv_pool import KVPool, PagedKV
from engine.text.model_config import ModelConfig

CONFIG = ModelConfig(
    architecture="llama",
    num_layers=2,
    dim=32,
    ffn_dim=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    rms_eps=1e-5,
    rope_base=1e4,
    context_length=4096,
    vocab_size=64,
)
SHARED = list(range(100, 132))  # two whole blocks both sessions start with


def session(pool: KVPool, ids: list[int]) -> PagedKV:
    rng = np.random.default_rng(len(ids))
    shape = (CONFIG.num_layers, CONFIG.num_kv_heads, len(ids), CONFIG.head_dim)
    k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    return pool.load("tenant", k, v, ids)


def found(pool: KVPool, ids: list[int]) -> int:
    """Positions of `ids` a new table takes from the pool's known blocks."""
    kv = pool.new_kv("tenant")
    n = kv.extend_prefix(ids, len(ids))
    kv.release()
    return n


def test_a_deleted_sessions_own_blocks_are_not_found_again() -> None:
    pool = KVPool(CONFIG, 32, np.dtype(np.float32), np, "fingerprint")
    mine, theirs = [*SHARED, *range(200, 248)], [*SHARED, *range(300, 332)]
    deleted, other = session(pool, mine), session(pool, theirs)
    released = session(pool, list(range(400, 448)))
    assert found(pool, mine) == 80 and found(pool, list(range(400, 448))) == 48
    deleted.release(forget=True)
    assert found(pool, mine) == 32  # only the blocks the other session still holds
    released.release()
    assert found(pool, list(range(400, 448))) == 48  # cached, as before
    other.release(forget=True)
    assert found(pool, theirs) == 0
    assert pool.alloc.num_held == 0
    pool.alloc.check()


def test_a_session_deleted_on_disk_has_its_cached_blocks_forgotten_by_hash() -> None:
    """Its blocks went back to the pool (cached) when it was spilled; DeleteSession forgets
    those its spill file lists that nothing holds."""
    pool = KVPool(CONFIG, 32, np.dtype(np.float32), np, "fingerprint")
    mine, theirs = [*SHARED, *range(200, 248)], [*SHARED, *range(300, 332)]
    spilled, other = session(pool, mine), session(pool, theirs)
    listed = list(spilled.hashes)  # what its spill file lists
    assert len(listed) == 5
    spilled.release()
    assert found(pool, mine) == 80  # cached: still found
    pool.alloc.forget_unheld(listed)
    assert found(pool, mine) == 32 and found(pool, theirs) == 64
    other.release()
    pool.alloc.check()
