"""Spill files: exact round trip, and every kind of damage detected, deleted and counted."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from common.errors import SpillFileError
from engine.kv_files.spill_file import SpilledKV, SpillStore, read_summary

SHAPE = (3, 2, 5, 8)  # layers, kv_heads, tokens, head_dim
LIKE = (3, 2, 8)


def sample_kv(seed: int = 0) -> SpilledKV:
    rng = np.random.default_rng(seed)
    k = rng.standard_normal(SHAPE).astype(np.float32)
    v = rng.standard_normal(SHAPE).astype(np.float32)
    return SpilledKV(k, v, [11, 12, 13, 14, 15])


@pytest.fixture
def store(tmp_path: Path) -> SpillStore:
    return SpillStore(tmp_path, fingerprint="model-a")


def test_round_trip_is_exact_and_atomic(store: SpillStore, tmp_path: Path) -> None:
    kv = sample_kv()
    written = store.write("local/s1", kv)
    path = store.path_for("local/s1")
    assert path.stat().st_size == written.size > kv.k.nbytes + kv.v.nbytes
    assert read_summary(path) == written
    assert written.key == "local/s1" and written.num_tokens == len(kv.token_ids)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, "blocks"])
    assert list((tmp_path / "blocks").iterdir()) == []  # 5 tokens: no full block, no temporary
    back = store.read("local/s1", like=LIKE, dtype=np.dtype(np.float32))
    assert back is not None and back.token_ids == kv.token_ids
    assert np.array_equal(back.k, kv.k) and np.array_equal(back.v, kv.v)
    assert store.read("local/other", like=LIKE, dtype=np.dtype(np.float32)) is None
    assert store.delete("local/s1") and not path.exists() and not store.delete("local/s1")


def test_keys_map_to_distinct_safe_names(store: SpillStore) -> None:
    names = {store.path_for(k).name for k in ["a/x", "b/x", "a/../../etc", "a/x\ty"]}
    assert len(names) == 4 and all("/" not in n and n.endswith(".wfkv") for n in names)


def corrupt_payload(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-7] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])


def bad_magic(path: Path) -> None:
    path.write_bytes(b"NOPE" + path.read_bytes()[4:])


def header_only(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:10])


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (corrupt_payload, "checksum"),
        (truncate, "payload"),
        (bad_magic, "not a spill file"),
        (header_only, "truncated"),
    ],
)
def test_damaged_files_are_rejected_deleted_and_counted(
    store: SpillStore, damage: object, reason: str
) -> None:
    store.write("local/s", sample_kv())
    path = store.path_for("local/s")
    damage(path)  # type: ignore[operator]
    with pytest.raises(SpillFileError) as err:
        store.read("local/s", like=LIKE, dtype=np.dtype(np.float32))
    assert reason in err.value.reason
    assert not path.exists() and store.num_rejected == 1


def test_another_models_file_is_rejected(tmp_path: Path) -> None:
    SpillStore(tmp_path, fingerprint="model-a").write("local/s", sample_kv())
    other = SpillStore(tmp_path, fingerprint="model-b")
    with pytest.raises(SpillFileError, match="another model"):
        other.read("local/s", like=LIKE, dtype=np.dtype(np.float32))
    assert not other.path_for("local/s").exists()


def test_layout_or_dtype_mismatch_is_rejected(store: SpillStore) -> None:
    store.write("local/s", sample_kv())
    with pytest.raises(SpillFileError, match="layout"):
        store.read("local/s", like=(3, 2, 16), dtype=np.dtype(np.float32))
    store.write("local/s", sample_kv())  # float32 converts to float16 only (test_spill_kv_dtype)
    with pytest.raises(SpillFileError, match="not convertible"):
        store.read("local/s", like=LIKE, dtype=np.dtype(np.float64))


def test_failed_write_leaves_no_file(
    store: SpillStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError, match="No space"):
        store.write("local/s", sample_kv())
    assert [p.name for p in tmp_path.iterdir()] == ["blocks"]
    assert list((tmp_path / "blocks").iterdir()) == []
