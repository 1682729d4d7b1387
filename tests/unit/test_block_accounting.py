"""Every block of the KV pool is accounted for after any sequence of requests, steps,
aborts, forks, deletes and evictions: each block's reference count is the number of block
tables that hold it, and free plus held blocks is the pool's size. Random operations on a
small pool (so that it fills up), several seeds, on the default model and on one whose
windowed layers keep their blocks apart and release those their window left (gpt-oss's)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from common.sampling import SamplingParams
from engine.config import EngineConfig
from engine.engine import Engine
from engine.kv.block_groups import RELEASED
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
    """Checks the accounts of every block group; the fewest blocks free (or cached) in
    any of them."""
    pool = engine.pool
    for g, alloc in enumerate(pool.allocs):
        alloc.check()
        counts = Counter(b for kv in tables(engine) for group, b in kv.held() if group == g)
        assert {b: n for b, n in enumerate(alloc.refs) if n} == dict(counts)
        assert alloc.num_free + len(counts) == alloc.num_blocks
    for kv in tables(engine):  # a windowed table holds its window's blocks, none before
        for g, group in enumerate(pool.groups):
            table, first = kv.tables[g], kv.first_held[g]
            assert all(b == RELEASED for b in table[:first])
            assert all(b != RELEASED for b in table[first:])
            if group.window and kv.offset:
                assert first * pool.block_size <= max(0, kv.offset + 1 - group.window)
    idle = [kv for _, kv in engine.sessions.items()]  # counted as they came and went
    assert engine.sessions.nbytes == engine.pool.held_bytes(idle)
    for kv in tables(engine):
        assert kv.offset <= kv.capacity and len(kv.token_ids) == kv.offset
        assert len(kv.hashes) <= kv.offset // kv.pool.block_size
    return min(alloc.num_free for alloc in pool.allocs)


def release_evicted(engine: Engine) -> None:
    engine.evicted_sessions.clear()  # copied out of the pool already: a worker spills them


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name", ["tiny_model", "tiny_gpt_oss"])
def test_random_operations_keep_every_block_accounted_for(
    request: pytest.FixtureRequest, name: str, seed: int
) -> None:
    tiny_model: Model = request.getfixturevalue(name)
    rng = random.Random(seed)
    block_bytes = 16 * tiny_model.bytes_per_token
    if name == "tiny_gpt_oss":  # a pool's bytes buy a block of the full layers and a
        block_bytes = block_bytes * 5 // 8  # quarter of the windowed ones' (block_groups.py)
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
    assert all(alloc.num_free == alloc.num_blocks for alloc in engine.pool.allocs)
