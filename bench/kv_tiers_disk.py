"""The disk side of the KV tiers benchmark: the page cache, and the spill files' own write and
restore throughput."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.kv.kv_pool import BLOCK_TOKENS, KVPool, PagedKV
from engine.kv.pool_read import PoolRead
from engine.kv_files.kv_dtypes import Q8_0, quantize
from engine.kv_files.spill_file import Listing, SpilledKV, SpillStore
from engine.text.model_config import ModelConfig


def drop_page_cache(paths: Sequence[Path]) -> str:
    """Drop cached pages of `paths` (after a sync); returns how it was done."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "global drop_caches"
    except OSError:
        pass
    try:
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "posix_fadvise DONTNEED"
    except (OSError, AttributeError):
        return "none (page cache kept)"


def resident_bytes(paths: Sequence[Path]) -> int | None:
    """Bytes of `paths` in the page cache, from util-linux `fincore`; None if unknown."""
    if not paths or shutil.which("fincore") is None:
        return None
    cmd = ["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, paths)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=10)
        return sum(int(x) for x in out.stdout.split())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


# --- the spill files' throughput --------------------------------------------------------------


def as_kv(values: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    return quantize(values) if dtype == Q8_0 else values.astype(dtype)


def random_kv(config: ModelConfig, tokens: int, dtype: np.dtype[Any]) -> SpilledKV:
    """A `tokens`-position session's KV of the model's shape in `dtype` (token ids 0..)."""
    shape = (config.num_layers, config.num_kv_heads, tokens, config.head_dim)
    rng = np.random.default_rng(0)
    k, v = (as_kv(rng.standard_normal(shape, dtype=np.float32), dtype) for _ in "kv")
    return SpilledKV(k, v, list(range(tokens)))


def spill_throughput(
    config: ModelConfig, tokens: int, repeats: int, dtype: np.dtype[Any]
) -> tuple[list[tuple[str, str, str, str]], set[str]]:
    """Write one `tokens`-position KV of the model's shape in `dtype` with SpillStore, and
    read it back as a worker does: its file, then its blocks straight into a pool."""
    kv = random_kv(config, tokens, dtype)
    k, v = kv.k, kv.v
    like = (config.num_layers, config.num_kv_heads, config.head_dim)
    mb = (k.nbytes + v.nbytes) / 1e6
    pool = KVPool(config, -(-tokens // BLOCK_TOKENS) + 1, dtype, np)
    times: dict[str, list[float]] = {"write": [], "cold": [], "cached": [], "raw": []}
    methods: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="wf-kvtiers-") as d:
        for i in range(repeats):  # a fresh directory each time: no block is there yet
            store = SpillStore(Path(d) / str(i), "bench")
            t = time.perf_counter()
            store.write("s", kv)
            times["write"].append(time.perf_counter() - t)
            paths = [p for p in store.directory.rglob("*") if p.is_file()]
            methods.add(drop_page_cache(paths))
            for name in ("cold", "cached"):
                t = time.perf_counter()
                table = restore(store, pool, like, dtype)
                times[name].append(time.perf_counter() - t)
                assert pool.take_kv(table)[1].tobytes() == v.tobytes()
                table.release(forget=True)
            drop_page_cache(paths)
            t = time.perf_counter()
            for p in paths:
                p.read_bytes()
            times["raw"].append(time.perf_counter() - t)
    rows = []
    labels = {
        "write": "spill write: blocks and session file (xxh3 + write + fsync + rename)",
        "cold": "restore into a pool, page cache dropped (read + checks + xxh3)",
        "cached": "restore into a pool, files in page cache",
        "raw": "plain read_bytes of the files, page cache dropped",
    }
    for name, label in labels.items():
        med = statistics.median(times[name])
        rows.append((label, f"{mb:.1f}", f"{med * 1e3:.1f}", f"{mb / med:.0f}"))
    return rows, methods


def restore(
    store: SpillStore,
    pool: KVPool,
    like: tuple[int, int, int],
    dtype: np.dtype[Any],
    python_reader: bool = False,
) -> PagedKV:
    """Session "s" read back into `pool` as a worker reads it (engine/kv/pool_read.py), its
    file kept; its block files by Python's reader, not the C kernels', if `python_reader`."""
    listing = store.read_listing("s", like=like, dtype=dtype)
    assert isinstance(listing, Listing), "a file of the pool's dtype whose blocks are whole"
    read = PoolRead(pool, listing)
    if python_reader:
        read.direct = None
    got, why = store.read_listed(listing, read, read.first)
    assert not why, why
    return read.finish(got)
