"""The bookkeeping of captured decode steps (engine/decode_graphs.py), driven on the CPU
through `Rerun` (a replay runs the step again from the bucket's buffers): buckets, one
capture per bucket reused after, the buffers allocated once, padding rows that touch no
session's KV, and a replayed step's logits and KV bit for bit the eager step's, on the
real default model. On a CUDA GPU (bench/gpu_check.sh) the same with CUDA graphs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.decode_graphs import (
    BUCKETS,
    Capturer,
    CudaCapturer,
    DecodeGraphs,
    Rerun,
    StaticStep,
    bucket_for,
)
from engine.device import cupy_with_gpu, to_host
from engine.forward import forward_static
from engine.kv.kv_pool import PagedKV
from engine.model import Model
from engine.step import Segment, StepLayout
from tests.paged import new_kv, pool_of, run_segments

PROMPTS = ([1, 2, 3, 4, 5], list(range(7, 40)), list(range(100, 118)))  # 5, 33, 18 tokens
WIDTH = 8  # block table entries a captured step holds: 128 positions


def test_the_smallest_bucket_that_holds_the_rows() -> None:
    assert [bucket_for(n) for n in (1, 2, 3, 5, 8, 9, 32)] == [1, 2, 4, 8, 8, 16, 32]
    assert bucket_for(BUCKETS[-1] + 1) is None


@pytest.fixture(scope="module")
def model_cuda(default_model_path: Path) -> Model:
    if cupy_with_gpu() is None:
        pytest.skip("needs a CUDA GPU and CuPy (none here)")
    return Model.load(default_model_path, device="cuda", kv_dtype="float32")


@pytest.fixture(params=["cpu", "cuda"])
def case(request: pytest.FixtureRequest) -> Iterator[tuple[Model, DecodeGraphs]]:
    """DecodeGraphs on the model of its device: the CPU's replaying by running again, the
    GPU's by CUDA graphs."""
    on_gpu = request.param == "cuda"
    m: Model = request.getfixturevalue("model_cuda" if on_gpu else "model_kv_float32")
    pool = pool_of(m)
    capturer: Capturer = CudaCapturer(m.xp) if on_gpu else Rerun()

    def run(step: StaticStep, layout: StepLayout) -> None:
        w, c = m.weights, m.config
        forward_static(
            w, c, m.family, m.rope, step.tokens, step.positions, layout, step.logits, m.xp
        )

    held = [alloc.num_held for alloc in pool.allocs]
    g = DecodeGraphs(pool, m.config.vocab_size, run, capturer, WIDTH)
    assert [alloc.num_held for alloc in pool.allocs] == [n + 1 for n in held]  # its pad blocks
    yield m, g
    for alloc, block in zip(pool.allocs, g.pad_blocks, strict=True):
        alloc.unref([block])


def decode(graphs: DecodeGraphs, kvs: list[PagedKV], ids: list[int]) -> np.ndarray:
    """One decode step of kvs (a token each) through the captured path; committed."""
    segments = []
    for kv in kvs:
        kv.prepare_write(kv.offset, 1)
        segments.append(Segment(kv, kv.offset, 1, want_logits=True))
    positions = [kv.offset for kv in kvs]
    layout = StepLayout.build(graphs.pool, segments)
    assert graphs.fits(layout, len(kvs))
    xp = graphs.pool.xp
    logits = to_host(graphs.run(xp.asarray(ids), xp.asarray(positions), layout))
    for kv, token in zip(kvs, ids, strict=True):
        kv.commit([token])
    return logits


def kv_bits(kv: PagedKV, graphs: DecodeGraphs) -> np.ndarray:
    """Every position's keys in the first group, [positions, layers, Hkv, D]."""
    pool, table, size = graphs.pool, kv.tables[0], graphs.pool.block_size
    return to_host(
        pool.xp.stack([pool.k[:, table[p // size], :, p % size] for p in range(kv.offset)])
    )


def test_replayed_steps_give_the_eager_steps_bits(case: tuple[Model, DecodeGraphs]) -> None:
    m, graphs = case
    eager = [new_kv(m) for _ in PROMPTS]
    captured = [new_kv(m) for _ in PROMPTS]
    for kvs in (eager, captured):
        run_segments(m, list(zip(kvs, PROMPTS, strict=True)))
    for step, n in enumerate((3, 3, 2, 3)):  # buckets 4, 4, 2, 4: padded rows
        ids = [50 + 7 * step + k for k in range(n)]
        want = run_segments(m, [(kv, [i]) for kv, i in zip(eager[:n], ids, strict=True)])
        got = decode(graphs, captured[:n], ids)
        assert np.array_equal(got.astype(np.float64), want), f"step {step}: the logits differ"
    assert sorted(graphs.replays) == sorted(graphs.steps) == [2, 4]  # a capture a bucket
    first, replay = graphs.steps[4].tokens, graphs.replays[4]
    ids = [5, 6, 7]
    want = run_segments(m, [(kv, [i]) for kv, i in zip(eager, ids, strict=True)])
    assert np.array_equal(decode(graphs, captured, ids).astype(np.float64), want)
    assert graphs.steps[4].tokens is first and graphs.replays[4] is replay  # reused, not made
    for a, b in zip(eager, captured, strict=True):  # and the padding wrote no session's KV
        assert b.token_ids == a.token_ids
        assert np.array_equal(kv_bits(a, graphs), kv_bits(b, graphs))


def test_a_step_past_the_captured_width_or_buckets_runs_eagerly(
    case: tuple[Model, DecodeGraphs],
) -> None:
    m, graphs = case
    long = new_kv(m)
    run_segments(m, [(long, list(range(1, WIDTH * 16 + 3)))])  # one block past the width
    long.prepare_write(long.offset, 1)
    layout = StepLayout.build(graphs.pool, [Segment(long, long.offset, 1, True)])
    assert not graphs.fits(layout, 1)
    many = [new_kv(m) for _ in range(BUCKETS[-1] + 1)]
    run_segments(m, [(kv, [3]) for kv in many])
    segments = []
    for kv in many:
        kv.prepare_write(kv.offset, 1)
        segments.append(Segment(kv, kv.offset, 1, True))
    assert not graphs.fits(StepLayout.build(graphs.pool, segments), len(many))
