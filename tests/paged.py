"""Running the forward pass by hand in tests: one KV pool per model, block tables on it,
and a step over several sequences' new tokens."""

from __future__ import annotations

import numpy as np

from engine.kv.kv_pool import KVPool, PagedKV
from engine.model import Model
from engine.step import Segment

TEST_POOL_TOKENS = 1 << 15  # positions one test model's pool holds

_pools: dict[int, tuple[Model, KVPool]] = {}


def pool_of(model: Model) -> KVPool:
    """The model's pool for tests (made on first use, kept with the model)."""
    held = _pools.get(id(model))
    if held is None or held[0] is not model:
        pool = model.new_pool(TEST_POOL_TOKENS * model.bytes_per_token)
        held = _pools[id(model)] = (model, pool)
    return held[1]


def new_kv(model: Model, scope: str = "") -> PagedKV:
    return pool_of(model).new_kv(scope)


def step(model: Model, parts: list[tuple[PagedKV, list[int]]]) -> np.ndarray:
    """One forward over the parts; the logits of each part's last token. Nothing is
    committed, so the same state can be stepped again."""
    tokens: list[int] = []
    positions: list[int] = []
    segments: list[Segment] = []
    for kv, ids in parts:
        start = kv.offset
        kv.prepare_write(start, len(ids))
        segments.append(Segment(kv, start, len(ids), want_logits=True))
        tokens += ids
        positions += range(start, start + len(ids))
    return model.run(pool_of(model), tokens, positions, segments)


def run_segments(model: Model, parts: list[tuple[PagedKV, list[int]]]) -> np.ndarray:
    """step(), then the new tokens committed; float64 logits."""
    logits = step(model, parts)
    for kv, ids in parts:
        kv.commit(ids)
    return np.asarray(logits, dtype=np.float64)


def run_step(model: Model, parts: list[tuple[PagedKV, list[int], bool]]) -> np.ndarray:
    """One forward over the parts (table, new tokens, wants logits), then committed."""
    tokens: list[int] = []
    positions: list[int] = []
    segments: list[Segment] = []
    for kv, ids, want in parts:
        kv.prepare_write(kv.offset, len(ids))
        segments.append(Segment(kv, kv.offset, len(ids), want_logits=want))
        tokens += ids
        positions += range(kv.offset, kv.offset + len(ids))
    logits = model.run(pool_of(model), tokens, positions, segments)
    for kv, ids, _ in parts:
        kv.commit(ids)
    return logits


def every_position(model: Model, kv: PagedKV, ids: list[int], rows: int = 128) -> np.ndarray:
    """The float64 logits after each token of `ids` appended to `kv`: each position a
    one-token segment of the one sequence, `rows` of them a step, each seeing the positions
    before it that the same step writes. A row's bits do not depend on what else is in its
    step, so these are the bits of one token a step, in a tenth of the time."""
    out = []
    for at in range(0, len(ids), rows):
        chunk, start = ids[at : at + rows], kv.offset
        kv.prepare_write(start, len(chunk))
        segments = [Segment(kv, start + i, 1, want_logits=True) for i in range(len(chunk))]
        positions = list(range(start, start + len(chunk)))
        out.append(model.run(pool_of(model), chunk, positions, segments))
        kv.commit(chunk)
    return np.concatenate(out).astype(np.float64)
