"""A q8_0 KV pool (--kv-dtype q8_0): blocks of 32 values quantized from those values alone,
the same bytes from NumPy and from the layers' one C call; the C attention kernels read the
blocks and give the float32 kernel's bits on the dequantized values, for every task shape;
rows stay batch invariant; and a spill file in q8_0 is never read by a float worker, nor a
float file by a q8_0 one: refused, deleted, counted."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import gguf
import numpy as np
import pytest

from common.errors import UnsupportedModelError
from engine.kv.kv_pool import detach
from engine.kv_files.kv_dtypes import Q8_0, dequantize, kv_name, quantize
from engine.kv_files.spill_file import SpillStore
from engine.model import Model, kv_dtype_for
from engine.ops import native
from engine.ops.attention_rows import rows_kernel
from tests.batch_invariance import check_random_prompts
from tests.native_checks import assert_one_call_equals_per_op
from tests.paged import new_kv, pool_of, run_segments
from tests.tiny_gguf import write_tiny_llama
from worker.spiller import Spiller

pytestmark = pytest.mark.skipif(native.library() is None, reason="needs the C kernels")
Q8 = gguf.GGMLQuantizationType.Q8_0


def test_a_block_is_quantized_from_its_own_32_values() -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((5, 3, 128)) * rng.uniform(0.01, 50, (5, 3, 1))).astype(np.float32)
    x[0, 0, 32:64] = 0.0  # a block of zeros: scale 0, codes 0
    q = quantize(x)
    assert q.dtype == Q8_0 and q.shape == (5, 3, 4) and q.nbytes == x.size * 34 // 32
    for i in range(4):  # each block alone gives the same bytes
        assert quantize(x[..., 32 * i : 32 * (i + 1)])[..., 0].tobytes() == q[..., i].tobytes()
    assert q[0, 0, 1]["d"] == 0 and not q[0, 0, 1]["q"].any()
    assert np.abs(q["q"]).max() == 127  # the largest magnitude of each block is +-127
    back = dequantize(q)
    error = np.abs(back - x).reshape(5, 3, 4, 32).max(axis=-1)
    scale = q["d"].astype(np.float32)
    assert (error <= 0.51 * scale + 1e-3 * np.abs(x).reshape(5, 3, 4, 32).max(axis=-1)).all()


@pytest.mark.parametrize(
    "lengths",
    [[1], [1500], [17, 16, 15], [700, 33, 250, 999, 64, 2, 400, 640], list(range(300, 320))],
    ids=["one-key", "one-long-row-split", "few-rows", "whole-rows", "a-chunks-rows"],
)
@pytest.mark.parametrize("heads", [(9, 3, 64), (32, 4, 128), (8, 8, 128), (12, 4, 96)])
def test_the_q8_kernel_gives_the_float32_kernels_bits_on_dequantized_values(
    lengths: list[int], heads: tuple[int, int, int]
) -> None:
    h, hkv, d = heads
    rng = np.random.default_rng(len(lengths) + d)
    shape = (200, hkv, 16, d)
    kq = quantize(rng.standard_normal(shape).astype(np.float32) * 2)
    vq = quantize(rng.standard_normal(shape).astype(np.float32))
    tables = np.stack([rng.permutation(200)[:100] for _ in lengths]).astype(np.int32)
    if len(lengths) == 20:  # one table, consecutive positions: a chunk's rows
        tables[:] = tables[0]
    q = rng.standard_normal((len(lengths), h, d)).astype(np.float32)
    n = np.asarray(lengths, dtype=np.int32)
    outs = []
    for k, v in ((kq, vq), (dequantize(kq), dequantize(vq))):
        out = np.full((len(lengths), h, d), np.nan, np.float32)
        rows_kernel()(q, k, v, tables, n, d**-0.5, out)
        outs.append(out)
    assert not np.isnan(outs[0]).any()
    assert np.array_equal(outs[0], outs[1])


@pytest.fixture(scope="module")
def tiny_q8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama of heads of 32 values (one q8_0 block each)."""
    path = tmp_path_factory.mktemp("q8") / "m.gguf"
    return write_tiny_llama(path, matrix_type=Q8, seed=4, dim=256, num_heads=8, ffn_dim=256)


def test_one_call_writes_and_reads_the_q8_pool_as_the_per_op_loop(
    tiny_q8: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Model.load(tiny_q8, device="cpu", weights="quantized", kv_dtype="q8_0")
    assert model.kv_dtype == Q8_0 and pool_of(model).k.dtype == Q8_0
    assert model.bytes_per_token == 2 * 2 * 2 * 34  # 2 layers, 2 KV heads of one block
    assert_one_call_equals_per_op(model, monkeypatch, lowest_id=3)


def test_rows_on_a_q8_pool_equal_their_runs_alone(tiny_q8: Path) -> None:
    check_random_prompts(Model.load(tiny_q8, device="cpu", kv_dtype="q8_0"))


@pytest.mark.parametrize(("wrote", "reads"), [("q8_0", "float32"), ("float32", "q8_0")])
def test_a_spill_file_between_q8_and_a_float_dtype_is_refused_and_counted(
    tiny_q8: Path, tmp_path: Path, wrote: str, reads: str
) -> None:
    writer, reader = (Model.load(tiny_q8, device="cpu", kv_dtype=d) for d in (wrote, reads))
    assert writer.fingerprint == reader.fingerprint  # one file: only the KV dtype differs
    kv = new_kv(writer, scope="local")
    run_segments(writer, [(kv, list(range(3, 40)))])  # 2 whole blocks and a tail
    store = SpillStore(tmp_path, writer.fingerprint)
    store.write("local/s", detach(kv))
    assert store.path_for("local/s").exists()
    spiller = Spiller(SpillStore(tmp_path, reader.fingerprint), reader)
    assert spiller.take_back("local/s") == (None, "rejected")
    assert spiller.stats.num_rejected == 1 and spiller.stats.num_converted == 0
    assert not store.path_for("local/s").exists()  # deleted: the session is recomputed
    spiller.close()


def test_q8_0_is_refused_where_no_kernel_reads_it(tmp_path: Path) -> None:
    f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
    assert kv_name(kv_dtype_for("q8_0", f32, np)) == "q8_0"
    assert kv_name(kv_dtype_for("q8_0", f32, ModuleType("cupy"))) == "q8_0"  # CUDA's kernel
    with pytest.raises(UnsupportedModelError, match=r"q8_0: this device keeps .*\(float16\);"):
        kv_dtype_for("q8_0", f16, ModuleType("cupy"))  # float16 compute: its own dtype only
    path = write_tiny_llama(tmp_path / "m.gguf")  # heads of 16 values
    with pytest.raises(UnsupportedModelError, match="heads of 16 values do not split into"):
        Model.load(path, device="cpu", kv_dtype="q8_0")
