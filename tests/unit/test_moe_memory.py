"""A mixture-of-experts model's experts (and its vocabulary matrices) are read in place from
the file's map, never copied; the tensors the loader does copy leave the map's resident
pages, so each byte of the file counts once in the worker's memory."""

from __future__ import annotations

import gc
import mmap
from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.model import Model
from engine.ops.quant.experts import ExpertMatrix, InPlaceRows
from engine.ops.quant.experts_native import load
from engine.text.gguf_file import open_gguf, release_pages
from tests.tiny_families import write_tiny

pytestmark = pytest.mark.skipif(load() is None, reason="needs the C kernels")


def mapped_rss(path: Path) -> int:
    """Bytes of `path`'s map resident in this process (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if "-" in line.split(" ", 1)[0]:  # a mapping's first line: range, perms, ..., path
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def test_experts_are_views_of_the_file_and_copies_leave_its_pages(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "moe.gguf", "qwen3moe", matrix_type=gguf.GGMLQuantizationType.Q8_0)
    reader = open_gguf(path)  # what the file holds, read first and let go of
    sizes = {t.name: int(t.data.nbytes) for t in reader.tensors}
    gate_bytes = np.array(
        reader.tensors[[t.name for t in reader.tensors].index("blk.1.ffn_gate_exps.weight")].data
    )
    del reader
    gc.collect()
    w = Model.load(path, device="cpu").weights
    in_place = [w.embed] + [
        m for lw in w.layers if lw.moe for m in (lw.moe.gate, lw.moe.up, lw.moe.down)
    ]
    in_place_gate = in_place[1 + 3]  # layer 1's
    # an MoE model's attention matrices are read in place too: q, k, v side by side
    assert all(isinstance(lw.wqkv, InPlaceRows) for lw in w.layers)
    in_place += [m for lw in w.layers for m in (*lw.wqkv.parts, lw.wo)]
    # where the kernels repack a matrix (int_packed.c: the attention matrices here, never an
    # expert) it owns its bytes and leaves the file's pages like any other copy
    assert all(isinstance(m, ExpertMatrix) for m in in_place)
    assert all(m.data.flags.owndata == m.packed for m in in_place)
    assert not any(m.packed for m in in_place[: 1 + 3 * len(w.layers)])  # embedding, experts
    assert np.array_equal(in_place_gate.data.reshape(-1), gate_bytes.reshape(-1))
    in_place_bytes = sum(m.nbytes for m in in_place if not m.packed)
    copied_bytes = path.stat().st_size - in_place_bytes  # the header (vocabulary) included
    assert copied_bytes > 1024 * mmap.PAGESIZE
    # the load read every byte (the fingerprint); the copied tensors' pages were dropped
    slack = 2 * mmap.PAGESIZE * len(sizes)  # each tensor's partial first and last pages
    assert mapped_rss(path) <= in_place_bytes + slack


def test_released_pages_leave_resident_memory_and_read_back_the_same(tmp_path: Path) -> None:
    path = tmp_path / "blob.bin"
    payload = np.random.default_rng(0).integers(0, 256, 64 * mmap.PAGESIZE, dtype=np.uint8)
    path.write_bytes(payload.tobytes())
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    assert int(mapped.sum(dtype=np.int64)) == int(payload.sum(dtype=np.int64))  # all resident
    assert mapped_rss(path) == 64 * mmap.PAGESIZE
    view = mapped[100 : 100 + 40 * mmap.PAGESIZE]  # 39 whole pages inside it
    release_pages(view)
    assert mapped_rss(path) == 25 * mmap.PAGESIZE
    assert np.array_equal(view, payload[100 : 100 + 40 * mmap.PAGESIZE])  # read back in
