"""A float16 KV pool (--kv-dtype float16): the C attention kernels read it widening each
value as they load it, so every task shape gives the float32 kernel's bits on the widened
values; the layers' one C call writes the same float16 bytes as NumPy's cast in the
per-op loop; rows stay batch invariant; and a float32 spill file read by a float16 worker
is converted and continues the text (the quality against float32: test_kv_quality.py)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import gguf
import numpy as np
import pytest

from common.errors import InvalidRequestError, UnsupportedModelError
from engine.kv.kv_pool import detach
from engine.kv_files.spill_file import SpillStore
from engine.model import Model, kv_dtype_for
from engine.ops import native
from engine.ops.attention_rows import rows_kernel
from tests.batch_invariance import check_random_prompts
from tests.native_checks import assert_one_call_equals_per_op
from tests.paged import new_kv, pool_of, run_segments
from tests.tiny_gguf import write_tiny_llama
from tests.unit.test_kv_quality import text_ids
from worker.spiller import Spiller

pytestmark = pytest.mark.skipif(native.library() is None, reason="needs the C kernels")
F16 = np.dtype(np.float16)
H, HKV, D, BLOCK, NUM_BLOCKS = 9, 3, 64, 16, 200


@pytest.mark.parametrize(
    "lengths",
    [[1], [1500], [17, 16, 15], [700, 33, 250, 999, 64, 2, 400, 640]],
    ids=["one-key", "one-long-row-split", "few-rows", "whole-rows"],
)
def test_the_float16_kernel_gives_the_float32_kernels_bits_on_widened_values(
    lengths: list[int],
) -> None:
    rng = np.random.default_rng(len(lengths))
    shape = (NUM_BLOCKS, HKV, BLOCK, D)
    k16 = (rng.standard_normal(shape) * 2).astype(F16)
    v16 = rng.standard_normal(shape).astype(F16)
    tables = np.stack([rng.permutation(NUM_BLOCKS)[:100] for _ in lengths]).astype(np.int32)
    q = rng.standard_normal((len(lengths), H, D)).astype(np.float32)
    n = np.asarray(lengths, dtype=np.int32)
    kernel = rows_kernel()
    outs = []
    for k, v in ((k16, v16), (k16.astype(np.float32), v16.astype(np.float32))):
        out = np.full((len(lengths), H, D), np.nan, np.float32)
        kernel(q, k, v, tables, n, D**-0.5, out)
        outs.append(out)
    assert not np.isnan(outs[0]).any()
    assert np.array_equal(outs[0], outs[1])


def test_chunk_rows_on_a_float16_pool_equal_the_float32_kernel() -> None:
    rng = np.random.default_rng(3)
    shape = (NUM_BLOCKS, HKV, BLOCK, D)
    k16, v16 = rng.standard_normal(shape).astype(F16), rng.standard_normal(shape).astype(F16)
    table = rng.permutation(NUM_BLOCKS)[:40].astype(np.int32)
    lengths = np.arange(300, 320, dtype=np.int32)  # a chunk: one table, consecutive positions
    tables = np.tile(table, (len(lengths), 1))
    q = rng.standard_normal((len(lengths), H, D)).astype(np.float32)
    kernel, outs = rows_kernel(), []
    for k, v in ((k16, v16), (k16.astype(np.float32), v16.astype(np.float32))):
        out = np.empty((len(lengths), H, D), np.float32)
        kernel(q, k, v, tables, lengths, D**-0.5, out)
        outs.append(out)
    assert np.array_equal(outs[0], outs[1])


def test_one_call_writes_and_reads_the_float16_pool_as_the_per_op_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q8 = gguf.GGMLQuantizationType.Q8_0
    path = write_tiny_llama(
        tmp_path / "m.gguf",
        matrix_type=q8,
        seed=4,
        dim=256,
        num_heads=8,
        num_kv_heads=2,
        ffn_dim=256,
    )
    model = Model.load(path, device="cpu", weights="quantized", kv_dtype="float16")
    assert model.kv_dtype == F16 and pool_of(model).k.dtype == F16
    assert_one_call_equals_per_op(model, monkeypatch, lowest_id=3)


def test_rows_on_a_float16_pool_equal_their_runs_alone(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf", matrix_type=gguf.GGMLQuantizationType.Q8_0)
    check_random_prompts(Model.load(path, device="cpu", kv_dtype="float16"))


def test_kv_dtype_names_and_refusals() -> None:
    f32 = np.dtype(np.float32)
    assert kv_dtype_for("auto", f32, np) == F16 and kv_dtype_for("float32", f32, np) == f32
    assert kv_dtype_for("auto", F16, np) == F16
    assert kv_dtype_for("auto", f32, ModuleType("cupy")) == f32
    with pytest.raises(InvalidRequestError, match="kv_dtype: must be one of auto"):
        kv_dtype_for("q4_0", f32, np)
    with pytest.raises(UnsupportedModelError, match="--kv-dtype float32: the CPU with"):
        kv_dtype_for("float32", F16, np)
    cupy = ModuleType("cupy")  # CUDA: float16 beside float32 compute, the kernels widen it
    assert kv_dtype_for("float16", f32, cupy) == F16
    with pytest.raises(UnsupportedModelError, match=r"float32: this device keeps .*\(float16\);"):
        kv_dtype_for("float32", F16, cupy)


def test_a_float32_spill_file_restored_by_a_float16_worker_continues_the_text(
    model_kv_float32: Model, model: Model, tmp_path: Path
) -> None:
    model, half = model_kv_float32, model  # the default: float16
    ids = text_ids(model, 70)
    kv = new_kv(model, scope="local")
    run_segments(model, [(kv, ids[:-1])])
    warm = kv.fork()  # the float32 worker's own continuation
    store = SpillStore(tmp_path, model.fingerprint)
    store.write("local/s", detach(kv))
    spiller = Spiller(SpillStore(tmp_path, half.fingerprint), half)
    back, where = spiller.take_back("local/s")
    assert where == "disk" and back is not None and back.converted_from == "float32"
    assert back.k.dtype == F16 and spiller.stats.num_converted == 1
    assert spiller.stats.num_rejected == 0 and not store.path_for("local/s").exists()
    restored = pool_of(half).load(back.scope, back.k, back.v, back.token_ids)
    assert restored.offset == len(ids) - 1
    token = ids[-1]
    for _ in range(8):  # greedy, each side on its own KV
        want = run_segments(model, [(warm, [token])])[0]
        got = run_segments(half, [(restored, [token])])[0]
        assert np.abs(got - want).max() < 0.05
        top2 = np.sort(want)[-2:]
        if top2[1] - top2[0] > 0.1:  # a clear winner: the same token
            assert np.argmax(got) == np.argmax(want)
        token = int(np.argmax(want))
    spiller.close()
