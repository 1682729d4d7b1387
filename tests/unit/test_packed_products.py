"""Matrices repacked 16 rows to a group for the integer products (engine/ops/csrc/
int_packed.c, AVX-512 VNNI builds: Q8_0 and MXFP4) give the bits of the file's blocks: every
pair in any bucket and thread count; what is not packed is left as it is; the loader packs
an MoE model's vocabulary and attention matrices, not its experts or its embedding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.loader.experts import PACK_EXPERTS_ENV
from engine.model import Model
from engine.ops.quant.experts import ExpertMatrix, InPlaceRows
from engine.ops.quant.experts_native import ExpertKernels, Products, load
from tests.paged import new_kv, run_segments
from tests.tiny_families import write_tiny
from tests.tiny_gpt_oss import write_tiny_gpt_oss
from tests.unit.expert_cases import grouped, random_experts
from tests.unit.quant_cases import T

KERNELS = load()
PACKED_TYPES = (T.Q8_0, T.MXFP4)
E, N, K = 3, 48, 512
BUCKETS = ([0, 1, 2], [5, 17, 33], [8, 0, 9], [40, 3, 1])  # tiles of 8 pairs, their tails


def packing(qtype: T) -> ExpertKernels:
    if KERNELS is None:
        pytest.skip("no C compiler here")
    if KERNELS.pack(random_experts(np.random.default_rng(0), qtype, 1, 16, 256), 1) is None:
        pytest.skip(f"this build does not pack {qtype.name} (AVX-512 VNNI's alone)")
    return KERNELS


@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=lambda t: t.name)
def test_packed_products_are_the_bits_of_the_files_blocks(qtype: T) -> None:
    kernels = packing(qtype)
    rng = np.random.default_rng(int(qtype))
    raw = random_experts(rng, qtype, E, N, K)
    packed = kernels.pack(raw, 2)
    assert packed is not None and packed.packed and packed.data.nbytes == raw.data.nbytes
    assert not np.array_equal(packed.data, raw.data)  # the bytes moved
    x = rng.standard_normal((50, K)).astype(np.float32)
    for counts in BUCKETS:
        rows = rng.integers(0, len(x), sum(counts)).astype(np.int64)
        want = grouped(kernels, raw, x, counts, rows, 2)
        for threads in (1, 2):
            got = grouped(kernels, packed, x, counts, rows, threads)
            assert not np.isnan(got).any()
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (counts, threads)


def test_what_is_not_packed_is_left_as_it_is() -> None:
    kernels = packing(T.Q8_0)
    rng = np.random.default_rng(5)
    assert kernels.pack(random_experts(rng, T.Q8_0, 1, 37, 64), 1) is None  # 37 rows
    assert kernels.pack(random_experts(rng, T.Q4_K, 1, 16, 256), 1) is None  # not yet
    packed = kernels.pack(random_experts(rng, T.Q8_0, 1, 16, 64), 1)
    assert packed is not None and kernels.pack(packed, 1) is None  # not twice
    x = np.ones((1, 64), np.float32)
    with pytest.raises(ValueError, match="integers only"):
        grouped(kernels, packed, x, [1], np.zeros(1, np.int64), 1, Products.FLOAT)
    with pytest.raises(ValueError, match="kernels alone"):
        packed.dense(0)


def test_the_loader_packs_the_vocabulary_and_attention_not_the_experts_or_embedding(
    tmp_path: Path,
) -> None:
    """The experts stay views of the file (issue 32's memory item: not copied at load)."""
    packing(T.Q8_0)
    model = Model.load(write_tiny(tmp_path / "moe.gguf", "qwen3moe", matrix_type=T.Q8_0))
    w = model.weights
    assert isinstance(w.embed, ExpertMatrix) and not w.embed.packed
    assert isinstance(w.output, ExpertMatrix)  # here the embedding's (tied, float32)
    assert w.output is w.embed or w.output.packed == (w.output.qtype in PACKED_TYPES)
    attention = [m for lw in w.layers if isinstance(lw.wqkv, InPlaceRows) for m in lw.wqkv.parts]
    attention += [lw.wo for lw in w.layers if isinstance(lw.wo, ExpertMatrix)]
    assert len(attention) == 4 * len(w.layers) and any(m.packed for m in attention)
    assert all(m.packed == (m.n % 16 == 0) for m in attention)
    for lw in w.layers:
        assert lw.moe is not None
        assert not any(m.packed for m in (lw.moe.gate, lw.moe.up, lw.moe.down))


def test_experts_packed_when_asked_give_the_same_logits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WARMFLEET_PACK_EXPERTS=1: gpt-oss's MXFP4 experts packed at load too; a prompt's
    logits, one token at a time and in one prefill, the same bits as with them in the file."""
    packing(T.MXFP4)
    path = write_tiny_gpt_oss(tmp_path / "tiny.gguf")
    ids = list(range(100, 140))  # past the windowed layers' reach
    logits = {}
    for asked in ("0", "1"):
        monkeypatch.setenv(PACK_EXPERTS_ENV, asked)
        model = Model.load(path, device="cpu")
        experts = [m for lw in model.weights.layers if lw.moe for m in (lw.moe.gate, lw.moe.up)]
        assert all(m.packed == (asked == "1") for m in experts)
        kv = new_kv(model)
        steps = [run_segments(model, [(kv, ids[i : i + 1])])[0] for i in range(len(ids))]
        kv.release()
        kv = new_kv(model)
        logits[asked] = np.stack([*steps, run_segments(model, [(kv, ids)])[0]])
        kv.release()
    assert np.array_equal(logits["0"], logits["1"])
    monkeypatch.setenv(PACK_EXPERTS_ENV, "yes")
    with pytest.raises(ValueError, match="expected 0 or 1"):
        Model.load(path, device="cpu")
