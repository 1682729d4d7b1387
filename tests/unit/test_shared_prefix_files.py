"""A prompt prefix one worker writes as block files for another of its host
(SpillStore.write_blocks) and that one reads back (SpillStore.read_prefix): the longest run
of the prompt's whole blocks on disk from its start, in the reader's tenant and KV dtype
only; and the pool's probe of which blocks it knows (BlockAllocator.knows)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.kv.blocks import BlockAllocator
from engine.kv_files.block_file import block_path
from engine.kv_files.spill_file import SpilledKV, SpillStore

LAYERS, KV_HEADS, HEAD_DIM = 3, 2, 8
LIKE = (LAYERS, KV_HEADS, HEAD_DIM)
F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
PREFIX = list(range(200, 248))  # three whole blocks of 16


def prefix_kv(scope: str = "acme", dtype: np.dtype = F32) -> SpilledKV:
    k = np.random.default_rng(3).standard_normal((LAYERS, KV_HEADS, 48, HEAD_DIM)).astype(dtype)
    return SpilledKV(k, -k, PREFIX, scope)


@pytest.fixture
def store(tmp_path: Path) -> SpillStore:
    return SpillStore(tmp_path, fingerprint="model-a")


def test_a_prefix_written_as_blocks_reads_back_exactly(store: SpillStore) -> None:
    written = prefix_kv()
    hashes, added = store.write_blocks(written)
    assert len(hashes) == 3 and added > 0
    assert [h.hex() for h in store.chain("acme", PREFIX, F32)] == hashes
    assert all(store.has_block(bytes.fromhex(h)) for h in hashes)
    assert store.write_blocks(written) == (hashes, 0)  # there already: nothing new
    prompt = [*PREFIX, 7, 8, 9]  # the reader's prompt goes on past the prefix
    kv = store.read_prefix("acme", prompt, like=LIKE, dtype=F32)
    assert kv.token_ids == PREFIX and kv.scope == "acme"
    assert np.array_equal(kv.k, written.k) and np.array_equal(kv.v, written.v)
    assert store.num_rejected == 0


def test_only_the_run_of_blocks_on_disk_from_the_start_comes_back(store: SpillStore) -> None:
    hashes, _ = store.write_blocks(prefix_kv())
    block_path(store.blocks, bytes.fromhex(hashes[1])).unlink()
    kv = store.read_prefix("acme", PREFIX, like=LIKE, dtype=F32)
    assert kv.token_ids == PREFIX[:16] and kv.k.shape[2] == 16
    assert np.array_equal(kv.k, prefix_kv().k[:, :, :16])
    block_path(store.blocks, bytes.fromhex(hashes[0])).unlink()
    assert store.read_prefix("acme", PREFIX, like=LIKE, dtype=F32).token_ids == []


def test_another_tenant_or_kv_dtype_finds_nothing(store: SpillStore) -> None:
    store.write_blocks(prefix_kv())
    assert store.read_prefix("bob", PREFIX, like=LIKE, dtype=F32).token_ids == []
    assert store.read_prefix("acme", PREFIX, like=LIKE, dtype=F16).token_ids == []
    store.write_blocks(prefix_kv(dtype=F16))  # a float16 worker's blocks: its own names
    kv = store.read_prefix("acme", PREFIX, like=LIKE, dtype=F16)
    assert kv.token_ids == PREFIX and kv.k.dtype == F16


def test_the_pools_probe_takes_no_block() -> None:
    alloc = BlockAllocator(4)
    block = alloc.allocate()
    alloc.publish(block, b"h" * 32)
    assert alloc.knows(b"h" * 32) and not alloc.knows(b"x" * 32)
    alloc.unref([block])  # cached, still known
    assert alloc.knows(b"h" * 32) and alloc.refs[block] == 0
