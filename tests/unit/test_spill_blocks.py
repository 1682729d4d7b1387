"""Spill files by block: full blocks go to block files named by their hash, written once
for every session that holds them; a damaged, missing or foreign block is refused, and
the blocks before it come back (the rest is recomputed)."""

from __future__ import annotations

import json
import shutil
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

from common.errors import SpillFileError
from engine.kv_files.block_file import sweep, usage
from engine.kv_files.spill_file import SpilledKV, SpillStore, read_summary

LAYERS, KV_HEADS, HEAD_DIM = 3, 2, 8
LIKE = (LAYERS, KV_HEADS, HEAD_DIM)
F32 = np.dtype(np.float32)
SYSTEM = list(range(100, 140))  # 40 tokens: two full blocks of 16, and 8 more


def session_kv(tail: list[int], scope: str = "acme", seed: int = 0) -> SpilledKV:
    """KV of SYSTEM + tail: the system part's values the same in every session."""
    ids = SYSTEM + tail
    shared = np.random.default_rng(1).standard_normal((LAYERS, KV_HEADS, 40, HEAD_DIM))
    own = np.random.default_rng(seed + 2).standard_normal((LAYERS, KV_HEADS, len(tail), HEAD_DIM))
    k = np.concatenate([shared, own], axis=2).astype(np.float32)
    return SpilledKV(k, -k, ids, scope)


@pytest.fixture
def store(tmp_path: Path) -> SpillStore:
    return SpillStore(tmp_path, fingerprint="model-a")


def read(store: SpillStore, key: str) -> SpilledKV:
    kv = store.read(key, like=LIKE, dtype=F32)
    assert kv is not None
    return kv


def test_shared_blocks_are_written_once(store: SpillStore) -> None:
    a = store.write("acme/a", session_kv([1, 2, 3]))
    block_bytes = usage(store.blocks) // 2
    assert len(a.blocks) == 2 and usage(store.blocks) == 2 * block_bytes
    b = store.write("acme/b", session_kv([4, 5, 6, 7], seed=1))
    assert b.blocks == a.blocks and usage(store.blocks) == 2 * block_bytes
    assert b.size == store.path_for("acme/b").stat().st_size  # it added no block
    assert a.size == store.path_for("acme/a").stat().st_size + 2 * block_bytes
    other = store.write("bob/a", session_kv([1, 2, 3], scope="bob"))  # another tenant
    assert not set(other.blocks) & set(a.blocks) and usage(store.blocks) == 4 * block_bytes
    for key, tail, seed in (("acme/a", [1, 2, 3], 0), ("acme/b", [4, 5, 6, 7], 1)):
        kv, want = read(store, key), session_kv(tail, seed=seed)
        assert kv.token_ids == want.token_ids and kv.scope == "acme" and not kv.incomplete
        assert np.array_equal(kv.k, want.k) and np.array_equal(kv.v, want.v)
    assert read_summary(store.path_for("acme/b")) is not None


def damage_second_block(store: SpillStore, key: str, how: str) -> None:
    summary = read_summary(store.path_for(key))
    assert summary is not None
    path = store.blocks / f"{summary.blocks[1]}.wfkb"
    data = path.read_bytes()
    if how == "corrupt":
        path.write_bytes(data[:-5] + bytes([data[-5] ^ 0xFF]) + data[-4:])
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "missing":
        path.unlink()
    else:  # foreign: another prefix's block put under this name
        shutil.copy(store.blocks / f"{summary.blocks[0]}.wfkb", path)


@pytest.mark.parametrize("how", ["corrupt", "truncated", "missing", "foreign"])
def test_a_bad_block_is_refused_and_the_blocks_before_it_come_back(
    store: SpillStore, how: str
) -> None:
    store.write("acme/a", session_kv([1, 2, 3]))
    damage_second_block(store, "acme/a", how)
    kv = read(store, "acme/a")
    want = session_kv([1, 2, 3])
    assert kv.incomplete and kv.token_ids == SYSTEM[:16] and store.num_rejected == 1
    assert np.array_equal(kv.k, want.k[:, :, :16]) and np.array_equal(kv.v, want.v[:, :, :16])
    assert len(list(store.blocks.glob("*.wfkb"))) == 1  # the bad block file is gone


def test_a_file_whose_blocks_are_not_its_tokens_is_refused(store: SpillStore) -> None:
    """A session's file edited to claim other tokens over the same blocks."""
    store.write("acme/a", session_kv([1, 2, 3]))
    path = store.path_for("acme/a")
    data = path.read_bytes()
    magic, version, n = struct.unpack_from("<4sII", data)
    header = json.loads(data[12 : 12 + n])
    header["token_ids"][0] += 1
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<4sII", magic, version, len(raw)) + raw + data[12 + n :])
    with pytest.raises(SpillFileError, match="not those of its tokens"):
        store.read("acme/a", like=LIKE, dtype=F32)
    assert not path.exists() and store.num_rejected == 1


def test_sweep_deletes_blocks_no_file_lists_once_old_enough(store: SpillStore) -> None:
    a = store.write("acme/a", session_kv([1, 2, 3]))
    b = store.write("bob/b", session_kv([1, 2, 3], scope="bob"))
    assert sweep(store.blocks, set(a.blocks) | set(b.blocks), grace_s=0) == 0
    store.delete("bob/b")
    assert sweep(store.blocks, set(a.blocks)) == 0  # young: may be a write in flight
    freed = sweep(store.blocks, set(a.blocks), grace_s=0)
    assert freed > 0 and sorted(p.stem for p in store.blocks.iterdir()) == sorted(a.blocks)
    assert read(store, "acme/a").token_ids == [*SYSTEM, 1, 2, 3]


def test_a_session_ending_on_a_block_boundary_has_an_empty_tail(store: SpillStore) -> None:
    kv = session_kv([])  # 40 tokens: two blocks and 8; then 32: two blocks, nothing more
    kv32 = SpilledKV(kv.k[:, :, :32], kv.v[:, :, :32], kv.token_ids[:32], "acme")
    written = store.write("acme/even", kv32)
    back = read(store, "acme/even")
    assert len(written.blocks) == 2 and back.token_ids == SYSTEM[:32]
    assert np.array_equal(back.k, kv32.k) and np.array_equal(back.v, kv32.v)


def test_two_threads_writing_the_same_blocks_leave_them_whole(store: SpillStore) -> None:
    """A spill and a share of one prefix run on two threads of the worker (worker/spiller.py):
    each writes its own temporary file, so neither can rename the other's half-written one
    into place."""
    kv, start, failed = session_kv([1, 2, 3]), threading.Barrier(2), []

    def write_blocks() -> None:
        try:
            for _ in range(20):
                start.wait(timeout=30)
                for path in store.blocks.glob("*.wfkb"):
                    path.unlink(missing_ok=True)  # so that both write, not only touch
                start.wait(timeout=30)
                store.write_blocks(kv)
        except Exception as e:  # reported by the test's thread below
            failed.append(e)
            start.abort()

    threads = [threading.Thread(target=write_blocks) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not failed, failed
    store.write("acme/a", kv)  # its blocks there already: only the session's own file
    got = read(store, "acme/a")
    assert np.array_equal(got.k, kv.k) and np.array_equal(got.v, kv.v)
    assert not list(store.blocks.glob(".*.tmp"))
