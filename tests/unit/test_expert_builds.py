"""The MoE kernels (engine/ops/csrc/experts.c, experts_int.c, moe.c) built for other
instruction sets. The integer products' sums are exact and their float steps one fixed
chain, so every build (AVX-512 with VNNI, AVX-512 without it (-march=skylake-avx512), AVX2
(-march=haswell), no AVX at all (-march=x86-64: plain C)) gives the same bits where this
machine runs it. The float32 products: for AVX2 the 16-lane accumulators are two 8-lane
halves, each lane summed in the same order and the halves joined by the same tree, so their
outputs equal the AVX-512 build's bit for bit; built with no AVX they still read every
weight exactly and stay within float32's summation bound."""

from __future__ import annotations

import ctypes
import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from engine.ops import native
from engine.ops.quant.experts import ExpertMatrix
from engine.ops.quant.experts_native import ExpertKernels, Products
from tests.native.driver import haswell_library
from tests.unit.expert_cases import (
    BUCKETS,
    INT_TYPES,
    MOE_SHAPES,
    TYPES,
    E,
    K,
    MoEShape,
    bits,
    random_experts,
    random_moe,
    starts_of,
)
from tests.unit.quant_cases import T, summation_bound

CPU = set(native._cpu_flags().split())
CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(
    native.library() is None or CC is None or platform.machine() != "x86_64",
    reason="needs a C compiler on x86-64",
)
both_builds = pytest.mark.skipif(
    not {"avx512f", "avx2", "fma", "f16c"} <= CPU,
    reason="needs a CPU that runs both AVX-512 and AVX2 code",
)
# what -march=skylake-avx512 may use
SKYLAKE = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx2", "fma", "f16c"}


def build(tmp: Path, marches: tuple[str, ...]) -> dict[str, ExpertKernels]:
    """experts.c, experts_int.c, int_packed.c and moe.c with the engine's flags but each
    -march, compiled side by side."""
    assert CC is not None
    sources = [
        str(native.CSRC / name)
        for name in ("experts.c", "experts_int.c", "int_packed.c", "moe.c", "par.c")
    ]
    jobs = {}
    for march in marches:
        flags = native.flags(march)
        out = tmp / f"experts-{march}.so"
        jobs[march] = (out, subprocess.Popen([CC, *flags, "-o", str(out), *sources]))
    for out, job in jobs.values():
        assert job.wait(timeout=300) == 0, f"{CC} failed on {out.name}"
    return {march: ExpertKernels(ctypes.CDLL(str(out))) for march, (out, _) in jobs.items()}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ExpertKernels]:
    """x86-64, and skylake-avx512 (AVX-512 without VNNI) where this CPU runs it."""
    marches = ("x86-64", *(("skylake-avx512",) if SKYLAKE <= CPU else ()))
    return build(tmp_path_factory.mktemp("builds"), marches)


@pytest.fixture(scope="module")
def builds() -> dict[str, ExpertKernels]:
    """The engine's own kernels, and the whole library built for Haswell (the AVX2 tests'
    own, not compiled again here)."""
    engine = native.library()
    assert engine is not None
    return {"native": ExpertKernels(engine), "avx2": ExpertKernels(haswell_library())}


@pytest.fixture(scope="module")
def plain(compiled: dict[str, ExpertKernels]) -> ExpertKernels:
    return compiled["x86-64"]


@pytest.fixture(scope="module")
def every_build(
    builds: dict[str, ExpertKernels], compiled: dict[str, ExpertKernels]
) -> dict[str, ExpertKernels]:
    """The native, AVX2 and plain builds, and AVX-512 without VNNI where this CPU runs it."""
    found = {**builds, "plain": compiled["x86-64"]}
    if "skylake-avx512" in compiled:
        found["avx512"] = compiled["skylake-avx512"]
    return found


@pytest.fixture(scope="module")
def experts() -> dict[T, ExpertMatrix]:
    rng = np.random.default_rng(21)
    return {qtype: random_experts(rng, qtype) for qtype in TYPES}


def product(
    kernels: ExpertKernels,
    w: ExpertMatrix,
    x: np.ndarray,
    counts: list[int],
    rows: np.ndarray,
    products: Products = Products.FLOAT,
) -> np.ndarray:
    out = np.full((len(rows), w.n), np.nan, np.float32)
    kernels.matmul(w, x, rows, starts_of(counts), out, 2, products)
    return out


@both_builds
@pytest.mark.parametrize("qtype", INT_TYPES, ids=lambda t: t.name)
def test_integer_products_are_the_same_bits_in_every_build(
    every_build: dict[str, ExpertKernels], experts: dict[T, ExpertMatrix], qtype: T
) -> None:
    w, rng = experts[qtype], np.random.default_rng(int(qtype))
    x = rng.standard_normal((40, K)).astype(np.float32)
    x[5] = 0.0  # a zero row: d = 0
    for counts in (list(BUCKETS), [3, 4, 0, 7, 1, 2]):  # tiles of 1-4 pairs and their tails
        rows = rng.integers(0, len(x), sum(counts)).astype(np.int64)
        outs = {
            name: product(k, w, x, counts, rows, Products.INTEGER)
            for name, k in every_build.items()
        }
        assert not np.isnan(outs["native"]).any()
        for name, out in outs.items():
            assert np.array_equal(out.view(np.uint32), outs["native"].view(np.uint32)), name


@both_builds
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_float32_products_built_for_avx2_equal_the_native_builds_bit_for_bit(
    builds: dict[str, ExpertKernels], experts: dict[T, ExpertMatrix], qtype: T
) -> None:
    w, rng = experts[qtype], np.random.default_rng(int(qtype))
    x = rng.standard_normal((40, K)).astype(np.float32)
    for counts in (list(BUCKETS), [3, 4, 0, 7, 1, 2]):  # tiles of 1-4 pairs, 1-2 fused
        rows = rng.integers(0, len(x), sum(counts)).astype(np.int64)
        outs = {name: product(k, w, x, counts, rows) for name, k in builds.items()}
        assert not np.isnan(outs["avx2"]).any()
        assert np.array_equal(outs["avx2"].view(np.uint32), outs["native"].view(np.uint32))


@both_builds
@pytest.mark.parametrize("products", Products, ids=lambda p: p.name.lower())
@pytest.mark.parametrize("shape", MOE_SHAPES, ids=lambda s: f"{s[0].name}-{s[1].name}")
def test_moe_built_for_avx2_equals_the_native_builds_bit_for_bit(
    builds: dict[str, ExpertKernels], shape: MoEShape, products: Products
) -> None:
    x = np.random.default_rng(2).standard_normal((16, shape[4])).astype(np.float32)
    outs = {
        name: random_moe(shape, k, products=products).run(x, threads=2)
        for name, k in builds.items()
    }
    assert np.array_equal(outs["avx2"].view(np.uint32), outs["native"].view(np.uint32))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_built_without_avx_float32_products_read_every_weight_exactly_within_bound(
    plain: ExpertKernels, experts: dict[T, ExpertMatrix], qtype: T
) -> None:
    w = experts[qtype]
    one_hot = product(
        plain, w, np.eye(K, dtype=np.float32), [K, 0, 0, 0, 0, 0], np.arange(K, dtype=np.int64)
    )
    assert np.array_equal(bits(one_hot.T), bits(w.dense(0)))
    x = np.random.default_rng(3).standard_normal((6, K)).astype(np.float32)
    out = product(plain, w, x, [1] * E, np.arange(E, dtype=np.int64))
    for e in range(E):
        dense = w.dense(e)
        err = np.abs(out[e] - x[e].astype(np.float64) @ dense.T.astype(np.float64))
        assert np.all(err <= summation_bound(x[e : e + 1], dense)[0]), f"expert {e}"
