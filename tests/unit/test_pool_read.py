"""A session read back straight into a pool's blocks (engine/kv/pool_read.py), as a worker
with a host pool does: the same bytes and the same next tokens as the session had warm, on
a llama-shaped model and on gpt-oss (two block groups: its windowed layers and the rest);
blocks the pool still knows are taken, not read; a damaged block ends the read there, its
file deleted and counted, and the table holds the blocks before it and no more; a prompt's
prefix on disk is read in place up to its first missing block, uncounted; a full pool evicts
idle sessions to make room, or gives up holding nothing (a step's sequence then ends). Spills
are written on a thread of lower priority; a restore runs on one of the worker's own, its
block files read by threads of lower priority."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from common.enums import FinishReason
from common.sampling import SamplingParams
from engine.config import EngineConfig
from engine.engine import Engine
from engine.kv.kv_pool import detach
from engine.kv.pool_read import PoolRead
from engine.kv_files.block_reads import READ_NICE
from engine.kv_files.block_reads import _readers as block_readers
from engine.kv_files.spill_file import Listing, SpilledKV, SpillStore
from engine.model import Model
from engine.sequence import Request
from tests.unit.engine_driver import drive, run_alone
from worker.spiller import WRITE_NICE, Spiller

GREEDY = SamplingParams(max_tokens=6)
BLOCK = 16
MODELS = ("tiny_model", "tiny_gpt_oss")


@pytest.fixture(params=MODELS)
def model(request: pytest.FixtureRequest) -> Model:
    loaded: Model = request.getfixturevalue(request.param)
    return loaded


def spilled_session(model: Model, n: int) -> tuple[Engine, list[int], SpilledKV]:
    """An engine that held session "s" after a turn of an n-token prompt and gave it up
    (its blocks cached in the pool, unheld), the turn's tokens, and its KV."""
    engine = Engine(model)
    ids = [int(t) for t in np.random.default_rng(n).integers(3, model.config.vocab_size, n)]
    out = drive(engine, {0: [Request("1", ids, GREEDY, cache_key="s")]})["1"]
    kv = engine.sessions.take("s")
    assert kv is not None and kv.held_from() == [0] * model.config.num_layers  # all held
    return engine, ids + out.ids, detach(kv)


def listing(store: SpillStore, model: Model) -> Listing:
    c = model.config
    like = (c.num_layers, c.num_kv_heads, c.head_dim)
    got = store.read_listing("acme/s", like=like, dtype=model.kv_dtype)
    assert isinstance(got, Listing)
    return got


def test_a_session_read_into_a_fresh_pool_continues_as_it_would_warm(
    model: Model, tmp_path: Path
) -> None:
    # 25 positions: one whole block and a tail, inside gpt-oss's 16-position window's reach
    _, ids, spilled = spilled_session(model, 19)
    store = SpillStore(tmp_path, model.fingerprint)
    assert len(store.write("acme/s", spilled).blocks) == len(spilled.token_ids) // BLOCK == 1
    engine = Engine(model)  # a pool that knows nothing: every block is read
    read = PoolRead(engine.pool, listing(store, model))
    assert read.first == 0 and len(engine.pool.groups) == (2 if model.config.sliding_window else 1)
    got, why = store.read_listed(read.listing, read, read.first)
    assert (got, why) == (len(spilled.token_ids), "")
    table = read.finish(got)
    k, v, token_ids = table.state()
    assert token_ids == spilled.token_ids
    assert k.tobytes() == spilled.k.tobytes() and v.tobytes() == spilled.v.tobytes()
    second = [*ids, 7, 8, 9]
    seq = engine.add(Request("2", second, GREEDY, cache_key="acme/s"), table)
    assert seq.num_cached == len(spilled.token_ids)
    tokens: list[int] = []
    while engine.has_work:
        tokens += [t for o in engine.step() if o.request_id == "2" for t in o.token_ids]
    assert tokens == run_alone(model, Request("cold", second, GREEDY)).ids


def test_blocks_the_pool_still_knows_are_taken_not_read(tiny_model: Model, tmp_path: Path) -> None:
    engine, _, spilled = spilled_session(tiny_model, 50)  # 3 whole blocks and a tail
    store = SpillStore(tmp_path, tiny_model.fingerprint)
    blocks = store.write("acme/s", spilled).blocks
    assert len(blocks) == 3
    engine = Engine(tiny_model)
    k, v, ids = spilled.k[:, :, :32], spilled.v[:, :, :32], spilled.token_ids[:32]
    engine.pool.load(spilled.scope, k, v, ids).release()  # its two blocks stay cached
    for h in blocks[:2]:  # not there to read: a read of them would fail
        (store.blocks / f"{h}.wfkb").unlink()
    read = PoolRead(engine.pool, listing(store, tiny_model))
    assert read.first == 2
    got, why = store.read_listed(read.listing, read, read.first)
    assert (got, why) == (len(spilled.token_ids), "") and store.num_rejected == 0
    k, v, token_ids = read.finish(got).state()
    assert token_ids == spilled.token_ids and k.tobytes() == spilled.k.tobytes()
    assert v.tobytes() == spilled.v.tobytes()


def test_a_damaged_block_ends_the_read_and_the_blocks_past_it_go_back(
    tiny_model: Model, tmp_path: Path
) -> None:
    _, _, spilled = spilled_session(tiny_model, 50)
    store = SpillStore(tmp_path, tiny_model.fingerprint)
    blocks = store.write("acme/s", spilled).blocks
    bad = store.blocks / f"{blocks[1]}.wfkb"
    data = bytearray(bad.read_bytes())
    data[-5] ^= 0x01
    bad.write_bytes(bytes(data))
    engine = Engine(tiny_model)
    read = PoolRead(engine.pool, listing(store, tiny_model))
    got, why = store.read_listed(read.listing, read, read.first)
    assert (got, why) == (BLOCK, "checksum mismatch")
    assert not bad.exists() and store.num_rejected == 1
    table = read.finish(got)
    k, _, token_ids = table.state()
    assert token_ids == spilled.token_ids[:BLOCK]
    assert k.tobytes() == np.ascontiguousarray(spilled.k[:, :, :BLOCK]).tobytes()
    assert engine.pool.alloc.num_held == 1  # the reserved blocks past it were released
    table.release()
    assert engine.pool.alloc.num_held == 0


@pytest.mark.skipif(sys.platform != "linux", reason="threads have a priority of their own on Linux")
def test_spills_are_written_and_block_files_read_at_a_lower_priority(
    tiny_model: Model, tmp_path: Path
) -> None:
    spiller = Spiller(SpillStore(tmp_path, tiny_model.fingerprint), tiny_model)
    try:
        mine = os.getpriority(os.PRIO_PROCESS, 0)

        def nice() -> int:
            return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

        assert spiller._io.submit(nice).result() == min(19, mine + WRITE_NICE)
        # the restore's own thread at the worker's; its block files' readers lower
        assert spiller._reads.submit(nice).result() == mine
        assert block_readers().submit(nice).result() == min(19, mine + READ_NICE)
        assert spiller._shares.submit(nice).result() == mine  # another worker waits on it
    finally:
        spiller.close()


class _StuckWrites(SpillStore):
    """A store whose session writes wait for `go`."""

    go = threading.Event()

    def write(self, key: str, kv: SpilledKV) -> Any:
        assert self.go.wait(timeout=60)
        return super().write(key, kv)


def test_a_share_is_answered_while_a_spill_is_still_being_written(
    tiny_model: Model, tmp_path: Path
) -> None:
    spiller = Spiller(_StuckWrites(tmp_path, tiny_model.fingerprint), tiny_model)
    k = np.zeros((1, 1, 16, 8), dtype=np.float32)
    try:
        spiller.spill("acme/stuck", SpilledKV(k, k, list(range(16)), "acme"))
        answer = tmp_path / "answer"
        spiller.share(None, answer)
        deadline = time.monotonic() + 30
        while not answer.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert answer.exists() and spiller.is_writing("acme/stuck")
    finally:
        _StuckWrites.go.set()
        spiller.close()


def test_a_prefix_on_disk_is_read_into_the_pool_up_to_its_first_missing_block(
    tiny_model: Model, tmp_path: Path
) -> None:
    _, _, spilled = spilled_session(tiny_model, 50)  # 3 whole blocks and a tail
    store = SpillStore(tmp_path, tiny_model.fingerprint)
    blocks = store.write("acme/s", spilled).blocks
    (store.blocks / f"{blocks[2]}.wfkb").unlink()  # the third is not on disk: the run ends
    c = tiny_model.config
    like = (c.num_layers, c.num_kv_heads, c.head_dim)
    prompt = [*spilled.token_ids, 5, 6, 7]
    listing = store.prefix_listing(spilled.scope, prompt, like=like, dtype=tiny_model.kv_dtype)
    assert listing.listed == len(prompt) // BLOCK * BLOCK and listing.k_tail.shape[2] == 0
    engine = Engine(tiny_model)
    read = PoolRead(engine.pool, listing)
    got, why = store.read_listed(listing, read, read.first, counted=False)
    assert got == 2 * BLOCK and "missing" in why and store.num_rejected == 0
    k, v, token_ids = read.finish(got).state()
    assert token_ids == spilled.token_ids[: 2 * BLOCK]
    for a, b in ((k, spilled.k), (v, spilled.v)):
        assert a.tobytes() == np.ascontiguousarray(b[:, :, : 2 * BLOCK]).tobytes()
    assert engine.pool.alloc.num_held == 2


def test_a_full_pool_evicts_idle_sessions_for_a_read_or_gives_up_holding_nothing(
    tiny_model: Model, tmp_path: Path
) -> None:
    _, _, spilled = spilled_session(tiny_model, 50)  # 4 blocks: 3 whole and a tail
    store = SpillStore(tmp_path, tiny_model.fingerprint)
    store.write("acme/s", spilled)
    room = EngineConfig(kv_pool_bytes=5 * BLOCK * tiny_model.bytes_per_token)
    engine = Engine(tiny_model, room)  # 5 blocks: an idle session of 3 leaves too few
    ids = [int(t) for t in np.random.default_rng(9).integers(3, tiny_model.config.vocab_size, 40)]
    drive(engine, {0: [Request("idle", ids, GREEDY, cache_key="idle")]})
    assert "idle" in engine.sessions and engine.pool.alloc.num_held == 3
    read = engine.with_room(lambda: PoolRead(engine.pool, listing(store, tiny_model)))
    assert read is not None and "idle" not in engine.sessions  # evicted to make room
    assert [key for key, _ in engine.evicted_sessions] == ["idle"]  # for the worker to spill
    got, why = store.read_listed(read.listing, read, read.first)
    k, _, token_ids = read.finish(got).state()
    assert (token_ids, why) == (spilled.token_ids, "") and k.tobytes() == spilled.k.tobytes()
    small = Engine(tiny_model, EngineConfig(kv_pool_bytes=3 * BLOCK * tiny_model.bytes_per_token))
    assert small.with_room(lambda: PoolRead(small.pool, listing(store, tiny_model))) is None
    assert small.pool.alloc.num_held == 0  # the blocks it had taken went back


def test_a_step_that_finds_no_room_ends_its_sequence_and_holds_nothing(tiny_model: Model) -> None:
    engine = Engine(tiny_model, EngineConfig(kv_pool_bytes=2 * BLOCK * tiny_model.bytes_per_token))
    ids = [int(t) for t in np.random.default_rng(3).integers(3, tiny_model.config.vocab_size, 40)]
    out = engine.generate([Request("r", ids, GREEDY)])["r"]
    completion = out[-1].completion
    assert completion is not None and completion.finish_reason == FinishReason.LENGTH
    assert engine.pool.alloc.num_held == 0 and not engine.sequences
