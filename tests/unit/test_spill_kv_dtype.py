"""Spill files across KV dtypes: a file in another dtype is converted where that is exact or
safe (float32 <-> float16), counted; any other is refused like a damaged file (deleted,
counted) so the session is recomputed; block hashes differ by dtype, so blocks never pass
for each other."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.block_hash import scope_hash
from common.errors import SpillFileError
from engine.kv_files.chain import kv_root
from engine.kv_files.spill_file import SpilledKV, SpillStore

SHAPE = (3, 2, 37, 8)  # layers, kv_heads, tokens (two full blocks and a tail), head_dim
LIKE = (3, 2, 8)
F32, F16 = np.dtype(np.float32), np.dtype(np.float16)


def sample_kv(dtype: np.dtype, seed: int = 0) -> SpilledKV:
    rng = np.random.default_rng(seed)
    k = (rng.standard_normal(SHAPE) * 3).astype(dtype)
    v = rng.standard_normal(SHAPE).astype(dtype)
    return SpilledKV(k, v, list(range(100, 100 + SHAPE[2])), scope="local")


def test_float32_file_read_by_a_float16_worker_is_rounded_and_counted(tmp_path: Path) -> None:
    store = SpillStore(tmp_path, fingerprint="model-a")
    kv = sample_kv(F32)
    written = store.write("local/s", kv)
    assert len(written.blocks) == 2
    back = store.read("local/s", like=LIKE, dtype=F16)
    assert back is not None and back.k.dtype == F16 and back.token_ids == kv.token_ids
    assert np.array_equal(back.k, kv.k.astype(F16)) and np.array_equal(back.v, kv.v.astype(F16))
    assert (store.num_converted, store.num_rejected) == (1, 0) and not back.incomplete
    assert back.converted_from == "float32"


def test_float16_file_read_by_a_float32_worker_is_exact(tmp_path: Path) -> None:
    store = SpillStore(tmp_path, fingerprint="model-a")
    kv = sample_kv(F16, seed=1)
    store.write("local/s", kv)
    back = store.read("local/s", like=LIKE, dtype=F32)
    assert back is not None and back.k.dtype == F32
    assert np.array_equal(back.k.astype(F16), kv.k) and np.array_equal(back.v, kv.v)
    assert store.num_converted == 1


def test_a_file_in_a_dtype_it_does_not_convert_is_refused_deleted_and_counted(
    tmp_path: Path,
) -> None:
    store = SpillStore(tmp_path, fingerprint="model-a")
    store.write("local/s", sample_kv(np.dtype(np.float64)))  # no conversion to float16
    with pytest.raises(SpillFileError, match="not convertible"):
        store.read("local/s", like=LIKE, dtype=F16)
    assert (store.num_rejected, store.num_converted) == (1, 0)
    assert not store.path_for("local/s").exists()


def test_blocks_of_each_dtype_are_their_own_files(tmp_path: Path) -> None:
    store = SpillStore(tmp_path, fingerprint="model-a")
    a = store.write("local/a", sample_kv(F32))
    b = store.write("local/b", sample_kv(F16))
    assert set(a.blocks).isdisjoint(b.blocks)
    assert len(list((tmp_path / "blocks").iterdir())) == 4
    assert kv_root("m", F32) == "m" and kv_root("m", F16) == "m/kv=float16"
    assert scope_hash(kv_root("m", F16), "t") != scope_hash("m", "t")
    for key, dtype in (("local/a", F32), ("local/b", F16)):  # each as written
        back = store.read(key, like=LIKE, dtype=dtype)
        assert back is not None and back.k.dtype == dtype and not back.incomplete
    assert store.num_converted == 0
