"""Sliding-window layers keep only the blocks their window can still see (engine/kv/
block_groups.py), on the tiny gpt-oss model (4 layers, every other one on a 16-position
window, blocks of 16): a session past the window holds at most ceil(window / block) + 1
blocks in those layers, counted so in the warm budget; its next turn resumes warm; a spill
file holds only what is held and restores it exactly; a turn that resumes inside the window
history takes the released blocks back by hash, or recomputes from where it can. On the
CPU and on MLX (whose windowed layers' arrays grow only as far as their own block ids)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.sampling import SamplingParams
from engine.config import EngineConfig
from engine.engine import Engine, StepOutput
from engine.kv.blocks import BlockAllocator, PoolExhaustedError
from engine.kv.kv_pool import PagedKV, detach
from engine.kv_files.spill_file import SpillStore
from engine.model import Model
from engine.sequence import Request
from tests.tiny_gpt_oss import WINDOW
from tests.unit.engine_driver import drive, run_alone

GREEDY = SamplingParams(max_tokens=6)
DEVICES = {"cpu": "tiny_gpt_oss", "mlx": "tiny_gpt_oss_mlx"}
LONG = SamplingParams(max_tokens=40, ignore_eos=True)
BLOCK = 16


@pytest.fixture(params=list(DEVICES))
def model(request: pytest.FixtureRequest) -> Model:
    loaded: Model = request.getfixturevalue(DEVICES[request.param])
    return loaded


def prompt(model: Model, seed: int, n: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, model.config.vocab_size, n)]


def first_turn(model: Model, n: int = 90) -> tuple[Engine, list[int]]:
    """An engine holding session "s" after one turn of an n-token prompt; its tokens."""
    engine = Engine(model)
    ids = prompt(model, 1, n)
    out = drive(engine, {0: [Request("1", ids, GREEDY, cache_key="s")]})["1"]
    return engine, ids + out.ids


def session(engine: Engine) -> PagedKV:
    kv = engine.sessions.peek("s")
    assert kv is not None
    return kv


def test_windowed_layers_hold_their_window_and_the_budget_counts_it(model: Model) -> None:
    engine, ids = first_turn(model)
    kv, pool = session(engine), engine.pool
    assert [g.window for g in pool.groups] == [0, WINDOW] and pool.groups[1].layers == (0, 2)
    full, windowed = (len(kv.tables[g]) - kv.first_held[g] for g in (0, 1))
    assert full == -(-kv.offset // BLOCK) and kv.offset == len(ids) - 1  # the last is fed back
    assert 0 < windowed <= -(-WINDOW // BLOCK) + 1
    sizes = pool.group_block_bytes
    assert sizes[0] == sizes[1]  # two layers each
    assert engine.sessions.nbytes == kv.nbytes == (full + windowed) * sizes[0]
    # the released blocks are free to others, still known by hash until reused
    assert pool.allocs[1].num_held == windowed and pool.allocs[0].num_held == full


def test_the_next_turn_resumes_warm_with_a_cold_runs_tokens(model: Model) -> None:
    engine, ids = first_turn(model)
    second = [*ids, *prompt(model, 2, 7)]
    resumed = drive(engine, {0: [Request("2", second, GREEDY, cache_key="s")]})["2"]
    assert resumed.completion.cached_tokens == len(ids) - 1 > 4 * WINDOW
    assert resumed.ids == run_alone(model, Request("cold", second, GREEDY)).ids


def test_a_spill_file_holds_what_is_held_and_restores_exactly(model: Model, tmp_path: Path) -> None:
    engine, ids = first_turn(model)
    kv = engine.sessions.take("s")
    assert kv is not None
    held_from = kv.held_from()
    assert held_from[0] == held_from[2] > 0 and held_from[1] == held_from[3] == 0
    spilled = detach(kv)
    store = SpillStore(tmp_path, model.fingerprint)
    summary = store.write("acme/s", spilled)
    assert summary.blocks == ()  # a windowed session's blocks are not whole: none listed
    c = model.config
    like = (c.num_layers, c.num_kv_heads, c.head_dim)
    row_bytes = c.num_kv_heads * c.head_dim * spilled.k.dtype.itemsize
    n = spilled.k.shape[2]
    held_bytes = 2 * row_bytes * sum(n - start for start in held_from)  # keys and values
    header = summary.size - held_bytes  # the token ids and the layout, in JSON
    assert 0 < header < 8192 and held_bytes < 2 * row_bytes * c.num_layers * n
    back = store.read("acme/s", like=like, dtype=model.kv_dtype)
    assert back is not None and tuple(back.held_from) == tuple(held_from)
    for read, wrote in ((back.k, spilled.k), (back.v, spilled.v)):
        assert np.array_equal(read, wrote)  # zeros where nothing is held, on both sides
    restored = engine.load_kv("acme", back)
    again_k, again_v, again_ids = restored.state()
    assert again_ids == spilled.token_ids and restored.held_from() == held_from
    assert np.array_equal(again_k, spilled.k) and np.array_equal(again_v, spilled.v)
    second = [*ids, *prompt(model, 3, 5)]
    seq = engine.add(Request("2", second, GREEDY, cache_key="acme/s"), restored)
    assert seq.num_cached == len(ids) - 1
    outputs: list[StepOutput] = []
    while engine.has_work:
        outputs += [o for o in engine.step() if o.request_id == "2"]
    got = [t for o in outputs for t in o.token_ids]
    assert got == run_alone(model, Request("cold", second, GREEDY)).ids


@pytest.mark.parametrize("reused", [False, True])
def test_a_turn_resuming_inside_the_window_history(model: Model, reused: bool) -> None:
    """The next prompt keeps the first prompt but rewrites the reply (as gpt-oss's template
    drops a turn's reasoning): the windowed layers resume at the first prompt's end from the
    blocks they released, found by hash; once those were reused for others, from the last
    point whose window they still hold, or the start. Tokens as a cold run's either way."""
    engine, ids = first_turn(model, n=70)
    long_reply = drive(engine, {0: [Request("1b", ids, LONG, "s")]})
    ids = ids + long_reply["1b"].ids  # the session now runs 3 windows past the prompt
    if reused:  # every released block given to someone else (its hash forgotten)
        alloc = engine.pool.allocs[1]
        taken = [alloc.allocate() for _ in range(alloc.num_free)]
        alloc.unref(taken)
    second = [*ids[:70], *prompt(model, 4, 12)]
    redone = drive(engine, {0: [Request("2", second, GREEDY, cache_key="s")]})["2"]
    if reused:  # block 3 (positions 48-63) is gone: 64 .. 69 need it; block 0 too for any
        assert redone.completion.cached_tokens == 0
    else:
        assert redone.completion.cached_tokens == 70
    assert redone.ids == run_alone(model, Request("cold", second, GREEDY)).ids
    kv = session(engine)
    assert len(kv.tables[1]) - kv.first_held[1] <= -(-WINDOW // BLOCK) + 1


def test_a_lazy_allocator_reuses_released_blocks_past_its_soft_limit() -> None:
    """A windowed group's allocator: never used ids up to the soft limit, then blocks that
    left a window (cached) before more never used ones, and those only when nothing else is
    left; every block accounted for throughout."""
    alloc = BlockAllocator(8, soft_limit=2)
    first = [alloc.allocate() for _ in range(2)]
    assert first == [0, 1] and alloc.num_used == 2 and alloc.num_free == 6
    alloc.publish(first[0], b"h0")
    alloc.unref([first[0]])  # left the window: cached, known by its hash
    assert alloc.allocate() == 0 and not alloc.knows(b"h0")  # reused, not id 2
    assert [alloc.allocate() for _ in range(6)] == [2, 3, 4, 5, 6, 7]  # nothing else left
    alloc.check()
    with pytest.raises(PoolExhaustedError):
        alloc.allocate()


def test_many_short_sequences_do_not_run_a_windowed_group_out(tiny_gpt_oss: Model) -> None:
    """300 sequences inside their window at once (20-token prompts, 8 tokens each: 2 blocks
    in both groups), in a pool sized for them: the windowed group, sized as a quarter of the
    full group's bytes, takes more ids than that quarter and none ends for lack of room."""
    per_sequence, n = 64, 300  # positions each pool block pair is bought for
    bytes_per = tiny_gpt_oss.bytes_per_token * 5 // 8  # full layers and a windowed quarter
    pool_bytes = n * per_sequence * bytes_per
    config = EngineConfig(max_running=n, kv_pool_bytes=pool_bytes, session_budget_bytes=0)
    engine = Engine(tiny_gpt_oss, config)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    requests = [Request(f"r{i}", prompt(tiny_gpt_oss, 10 + i, 20), params) for i in range(n)]
    done = engine.generate(requests)
    assert sorted(len([t for o in out for t in o.token_ids]) for out in done.values()) == [8] * n
    windowed = engine.pool.allocs[1]
    assert windowed.num_used > windowed.soft_limit == engine.pool.num_blocks // 4
