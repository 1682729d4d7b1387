"""Block files read whole by the C kernels straight into a pool's blocks
(engine/kv/frame_reads.py, engine/ops/csrc/frame_read.c): the same bytes as the Python
reader block by block, in every KV dtype, with no view taken; a damaged file gives the same
count and reason as the Python reader does, deleted and counted; a file the C reader leaves
(a header past its first read) is read by Python; pieces land at the addresses given, more of
them than one preadv takes, with the payload's xxh3-64."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

from engine.kv.frame_reads import frame_reads
from engine.kv.kv_pool import KVPool
from engine.kv.paged_kv import PagedKV
from engine.kv.pool_read import PoolRead
from engine.kv_files.block_file import MAGIC, VERSION, block_path
from engine.kv_files.kv_dtypes import kv_dtype_named, quantize
from engine.kv_files.kv_frame import FrameRead, read_header, write_frame
from engine.kv_files.spill_file import Listing, SpilledKV, SpillStore
from engine.text.model_config import ModelConfig

CONFIG = ModelConfig(
    architecture="llama",
    num_layers=3,
    dim=64,
    ffn_dim=64,
    num_heads=2,
    num_kv_heads=2,
    head_dim=32,
    rms_eps=1e-5,
    rope_base=1e4,
    context_length=256,
    vocab_size=50,
)
BLOCK = 16
TOKENS = 5 * BLOCK + 3  # five block files and a tail
DTYPES = ("float32", "float16", "q8_0")
FINGERPRINT = "model-a"


@pytest.fixture(scope="module")
def reads() -> Any:
    found = frame_reads()
    assert found is not None, "the C kernels lack the frame reader: install libxxhash-dev"
    return found


def spill(directory: Path, dtype: np.dtype[Any]) -> tuple[SpillStore, SpilledKV, list[str]]:
    """The session written in `dtype`: its store, its KV, its block files' hashes (hex)."""
    shape = (CONFIG.num_layers, CONFIG.num_kv_heads, TOKENS, CONFIG.head_dim)
    rng = np.random.default_rng(7)
    k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in "kv")
    if dtype.names:  # q8_0
        k, v = quantize(k), quantize(v)
    kv = SpilledKV(k.astype(dtype), v.astype(dtype), list(range(3, 3 + TOKENS)), scope="acme")
    store = SpillStore(directory, FINGERPRINT)
    blocks = store.write("acme/s", kv).blocks
    return store, kv, list(blocks)


def read_back(
    store: SpillStore, dtype: np.dtype[Any], direct: bool
) -> tuple[int, str, PagedKV, list[int]]:
    """The session read into a fresh pool by the C reader (`direct`) or block by block;
    the blocks read by views (by Python)."""
    like = (CONFIG.num_layers, CONFIG.num_kv_heads, CONFIG.head_dim)
    listing = store.read_listing("acme/s", like=like, dtype=dtype)
    assert isinstance(listing, Listing)
    read = PoolRead(KVPool(CONFIG, 8, dtype, np), listing)
    assert read.direct is not None
    if not direct:
        read.direct = None
    by_python, views = [], read.views

    def counted(i: int) -> list[np.ndarray]:
        by_python.append(i)
        return views(i)

    read.views = counted  # type: ignore[method-assign]
    got, why = store.read_listed(listing, read, read.first)
    return got, why, read.finish(got), by_python


@pytest.mark.parametrize("name", DTYPES)
def test_the_c_reader_puts_every_block_where_python_does(
    reads: Any, name: str, tmp_path: Path
) -> None:
    dtype = kv_dtype_named(name)
    store, kv, _ = spill(tmp_path, dtype)
    got, why, table, by_python = read_back(store, dtype, direct=True)
    assert (got, why) == (TOKENS, "") and store.num_rejected == 0 and by_python == []
    k, v, ids = table.state()
    assert ids == kv.token_ids and k.tobytes() == kv.k.tobytes() and v.tobytes() == kv.v.tobytes()
    python = read_back(store, dtype, direct=False)[2].state()
    assert python[0].tobytes() == k.tobytes() and python[1].tobytes() == v.tobytes()


def foreign(data: bytearray) -> None:
    at = data.index(FINGERPRINT.encode())
    data[at : at + len(FINGERPRINT)] = b"model-b"  # the header's length unchanged


def flip(data: bytearray) -> None:
    data[-5] ^= 0x01


# each damage and the start of the reason it is refused for
DAMAGE: dict[str, tuple[Callable[[bytearray], None] | None, str]] = {
    "missing": (None, "a block it lists is missing"),
    "cut short": (lambda data: data.__delitem__(slice(-100, None)), "payload is "),
    "a flipped bit": (flip, "checksum mismatch"),
    "another model's": (foreign, "written by another model"),
    "not a block file": (lambda data: data.__setitem__(slice(0, 4), b"XXXX"), "not a block"),
    "another version": (
        lambda data: data.__setitem__(slice(4, 8), (9).to_bytes(4, "little")),
        "format version 9, expected 1",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_file_is_refused_as_the_python_reader_refuses_it(
    reads: Any, damage: str, tmp_path: Path
) -> None:
    said = {}
    for direct in (True, False):
        store, kv, blocks = spill(tmp_path / str(direct), np.dtype(np.float16))
        bad = block_path(store.blocks, bytes.fromhex(blocks[2]))  # the third block's file
        change, reason = DAMAGE[damage]
        if change is None:
            bad.unlink()
        else:
            data = bytearray(bad.read_bytes())
            change(data)
            bad.write_bytes(bytes(data))
        got, why, table, by_python = read_back(store, np.dtype(np.float16), direct)
        assert got == 2 * BLOCK and why.startswith(reason)
        assert not bad.exists() and store.num_rejected == 1
        assert 2 in by_python and (not direct or len(by_python) == 1)
        assert table.state()[2] == kv.token_ids[: 2 * BLOCK]
        said[direct] = why
    assert said[True] == said[False]


def test_a_header_past_the_c_readers_first_read_is_read_by_python(
    reads: Any, tmp_path: Path
) -> None:
    store, kv, _ = spill(tmp_path, np.dtype(np.float16))
    path = next(iter(store.blocks.glob("*.wfkb")))
    h, payload = read_header(path.read_bytes(), ("block", MAGIC, VERSION), 1 << 20, str(path))
    half = len(payload) // 2
    shape = h["shape"]
    k = np.frombuffer(payload[:half], np.float16).reshape(shape)
    v = np.frombuffer(payload[half:], np.float16).reshape(shape)
    keep = {x: h[x] for x in ("fingerprint", "previous", "token_ids")}
    write_frame(path, MAGIC, VERSION, {**keep, "note": "x" * 5000}, k, v)
    got, why, table, by_python = read_back(store, np.dtype(np.float16), direct=True)
    assert (got, why) == (TOKENS, "") and len(by_python) == 1
    assert table.state()[0].tobytes() == kv.k.tobytes()


def test_pieces_land_at_their_addresses_past_one_preadv(reads: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    k, v = (rng.standard_normal((700, 4), dtype=np.float32) for _ in "kv")  # 1,400 pieces
    path = tmp_path / "frame"
    write_frame(path, MAGIC, VERSION, {"what": "test"}, k, v)
    out = np.zeros((1400, 4), np.float32)
    order = rng.permutation(1400)  # piece j of the payload to row order[j]
    addresses = (out.ctypes.data + order * out.strides[0])[None, :]
    frame: Sequence[FrameRead | None] = reads.read([path], addresses, 16, MAGIC, VERSION)
    payload = np.concatenate([k, v])
    assert np.array_equal(out[order], payload)
    assert frame[0] is not None and frame[0].payload_bytes == payload.nbytes
    assert frame[0].digest == xxhash.xxh3_64(payload.tobytes()).hexdigest()
    assert read_header(frame[0].head, ("frame", MAGIC, VERSION), 1 << 20, "")[0]["what"] == "test"
    missing, wrong = tmp_path / "nothing", reads.read([path], addresses, 16, MAGIC, VERSION + 1)
    assert reads.read([missing], addresses, 16, MAGIC, VERSION) == [None] and wrong == [None]
