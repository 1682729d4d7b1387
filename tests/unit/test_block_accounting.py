"""Every block of the KV pool is accounted for after any sequence of requests, steps,
aborts, forks, deletes and evictions: each block's reference count is the number of block
tables that hold it, and free plus held blocks is the pool's size. Random operations on a
small pool (so that it fills up), several seeds."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from common.sampling import SamplingParams
from engine.config import EngineConfig
from engine.engine import Engine
from engine.kv.kv_pool import PagedKV, detach
from engine.model import Model
from engine.sequence import Request
from tests.unit.engine_driver import prompt

PREFIXES = [prompt(100 + i, n) for i, n in enumerate([40, 33, 16, 7])]


def tables(engine: Engine) -> list[PagedKV]:
    """Every block table the engine holds: idle sessions, running and paused sequences."""
    held = [kv for _, kv in engine.sessions.items()]
    return held + [seq.cache for seq in engine.sequences.values()]


def check(engine: Engine) -> int:
    """Checks the accounts; how many blocks are free (or cached)."""
    alloc = engine.pool.alloc
    alloc.check()
    counts = Counter(b for kv in tables(engine) for b in kv.blocks)
    assert {b: n for b, n in enumerate(alloc.refs) if n} == dict(counts)
    assert alloc.num_free + len(counts) == alloc.num_blocks
    idle = [kv for _, kv in engine.sessions.items()]  # counted as they came and went
    assert engine.sessions.nbytes == engine.pool.held_bytes(idle)
    for kv in tables(engine):
        assert kv.offset <= kv.capacity and len(kv.token_ids) == kv.offset
        assert len(kv.hashes) <= kv.offset // kv.pool.block_size
    return alloc.num_free


def release_evicted(engine: Engine) -> None:
    engine.evicted_sessions.clear()  # copied out of the pool already: a worker spills them


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_keep_every_block_accounted_for(tiny_model: Model, seed: int) -> None:
    rng = random.Random(seed)
    block_bytes = 16 * tiny_model.bytes_per_token
    config = EngineConfig(
        max_running=4, prefill_chunk_tokens=8, step_prefill_tokens=16,
        session_budget_bytes=6 * block_bytes, kv_pool_bytes=10 * block_bytes,
    )  # fmt: skip
    engine = Engine(tiny_model, config)
    keys = [f"s{i}" for i in range(5)]
    least_free = engine.pool.alloc.num_blocks
    for n in range(120):
        op = rng.random()
        if op < 0.35 and len(engine.sequences) < 6:
            key = rng.choice([*keys, None])
            if key is None or all(s.request.cache_key != key for s in engine.sequences.values()):
                ids = rng.choice(PREFIXES) + prompt(rng.randrange(1000), rng.randrange(1, 12))
                params = SamplingParams(max_tokens=rng.randrange(1, 20), seed=n)
                engine.add(Request(f"r{n}", ids, params, key, rng.choice("ab")))
        elif op < 0.75:
            engine.step()
        elif op < 0.82 and engine.sequences:
            engine.abort(rng.choice(list(engine.sequences)))
        elif op < 0.88 and len(engine.sessions):
            key, kv = rng.choice(engine.sessions.items())
            engine.adopt_session(rng.choice(keys), kv.fork())  # ForkSession
        elif op < 0.94 and len(engine.sessions):
            dropped = engine.sessions.take(rng.choice(engine.sessions.keys()))  # delete
            assert dropped is not None
            dropped.release()
        else:
            oldest = engine.sessions.pop_oldest()  # the kvstore orders a spill
            if oldest is not None:
                detach(oldest[1])
        release_evicted(engine)
        least_free = min(least_free, check(engine))
    assert least_free == 0  # the pool was full at least once: its guards were exercised
    while engine.has_work:
        engine.step()
        release_evicted(engine)
        check(engine)
    while (oldest := engine.sessions.pop_oldest()) is not None:
        oldest[1].release()
    assert engine.pool.alloc.num_free == engine.pool.alloc.num_blocks
