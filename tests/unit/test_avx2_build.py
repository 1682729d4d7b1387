"""The kernels built for AVX2 give the AVX-512 build's bits. Built with -march=haswell the
16-lane accumulators are two 8-lane halves, summed lane by lane in the same order and joined
by the same tree, so where this machine runs both builds every output must be equal bit for
bit: the products for every weight type and row count (the tile, its narrower tails, one
row), attention for every head layout the kernel specialises and for each task shape
(decode rows, whole rows, a chunk's runs)."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.kv_files.kv_dtypes import Q8_0, kv_name, quantize
from engine.ops import native
from engine.ops.attention_rows import KERNEL_KV_DTYPES, NO_SINKS, kernel_row_limit, rows_kernel
from engine.ops.chunks import AVX2_CHUNK_ROWS, SMALL_ROWS, kernel_chunk_rows
from engine.ops.quant.native import NativeKernels
from tests.native.driver import haswell_library
from tests.unit.quant_cases import TYPES, K, Stored, T, write_and_read

FLAGS = set(native._cpu_flags().split())
CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(
    native.library() is None or CC is None or not {"avx512f", "avx2", "fma", "f16c"} <= FLAGS,
    reason="needs a C compiler and a CPU that runs both AVX-512 and AVX2 code",
)
ROW_COUNTS = (1, 2, 3, 4, 5, 8, 17, 33)


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Stored:
    return write_and_read(Path(tmp_path_factory.mktemp("avx2")) / "types.gguf")


@pytest.fixture(scope="module")
def haswell() -> ctypes.CDLL:
    return haswell_library()


@pytest.fixture(scope="module")
def builds(haswell: ctypes.CDLL) -> dict[str, NativeKernels]:
    """The engine's own products (AVX-512 here) and the Haswell build's."""
    lib = native.library()
    assert lib is not None
    return {"avx512": NativeKernels(lib), "avx2": NativeKernels(haswell)}


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_products_built_for_avx2_equal_the_avx512_builds_bit_for_bit(
    stored: Stored, builds: dict[str, NativeKernels], qtype: T
) -> None:
    matrix, _ = stored[qtype]
    rng = np.random.default_rng(int(qtype))
    for rows in ROW_COUNTS:
        x = rng.standard_normal((rows, K)).astype(np.float32)
        outs = {}
        for name, kernels in builds.items():
            outs[name] = np.full((rows, matrix.shape[0]), np.nan, np.float32)
            kernels.matmul(matrix, x, outs[name], 2)
        assert not np.isnan(outs["avx2"]).any()
        assert np.array_equal(outs["avx2"], outs["avx512"]), f"{rows} rows differ"


@pytest.mark.parametrize(
    "heads",
    [(9, 3, 64), (32, 8, 128), (32, 4, 128), (28, 4, 128), (16, 16, 64), (8, 1, 64), (12, 4, 96)],
)
@pytest.mark.parametrize("kv_dtype", list(KERNEL_KV_DTYPES), ids=kv_name)
def test_attention_built_for_avx2_equals_the_avx512_builds_bit_for_bit(
    haswell: ctypes.CDLL, heads: tuple[int, int, int], kv_dtype: str
) -> None:
    h, hkv, d = heads
    rng = np.random.default_rng(h * d + hkv)
    values = (rng.standard_normal((72, hkv, 16, d)).astype(np.float32) for _ in range(2))
    k, v = (quantize(a) if kv_dtype == Q8_0 else a.astype(kv_dtype) for a in values)
    avx512 = rows_kernel()
    fn = getattr(haswell, KERNEL_KV_DTYPES[kv_dtype])
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p, p, p, p, i64, p, i64, i64, i64, i64, ctypes.c_float, p, ctypes.c_int]
    fn.argtypes += [i64, p]  # a sliding window (0: none), sinks (None: none)
    fn.restype = ctypes.c_int64  # 0, or the scratch bytes it could not allocate
    order = rng.permutation(72).astype(np.int32)
    sinks = rng.standard_normal(h).astype(np.float32)
    # single rows of different lengths (a task per KV head; a long one spread over the
    # threads where its KV heads are fewer than twice them; whole rows with 4+ rows), and
    # a decode row beside a 9-row chunk (runs of a chunk's rows); the last two again with
    # gpt-oss's sliding window and sinks
    cases = [[300], [1100], [1, 17, 250, 33], [500, *range(200, 209)]]
    for lengths, window in [(c, 0) for c in cases] + [(c, 100) for c in cases[2:]]:
        tables = np.stack([order[:70]] * len(lengths))
        lens = np.array(lengths, np.int32)
        q = rng.standard_normal((len(lengths), h, d)).astype(np.float32)
        want, got = np.empty_like(q), np.full_like(q, np.nan)
        limits = (window, sinks) if window else (0, NO_SINKS)
        avx512(q, k, v, tables, lens, d**-0.5, want, *limits)
        pointers = [a.ctypes.data for a in (q, k, v, tables)]
        at_sinks = sinks.ctypes.data if window else None
        rc = fn(
            *pointers,
            70,
            lens.ctypes.data,
            len(lengths),
            h,
            hkv,
            d,
            d**-0.5,
            got.ctypes.data,
            2,
            window,
            at_sinks,
        )
        assert rc == 0
        assert np.array_equal(got, want), f"{heads} {lengths}"


def elementwise_steps(built: ctypes.CDLL, gate_up: np.ndarray, threads: int) -> list[np.ndarray]:
    """`built`'s SiLU(gate) * up, RMS norm and rope (9 heads of 64) over gate_up's rows, on
    `threads` (rows enough that each call splits them)."""
    rows, ffn, d, heads = gate_up.shape[0], gate_up.shape[1] // 2, 64, 9
    rng = np.random.default_rng(6)
    w = rng.standard_normal(heads * d).astype(np.float32)
    cos_t, sin_t = (rng.standard_normal((40, d // 2)).astype(np.float32) for _ in range(2))
    pos = rng.integers(0, 40, rows).astype(np.int64)
    x = np.ascontiguousarray(gate_up[:, : heads * d])
    silu, norm = np.full((rows, ffn), np.nan, np.float32), np.full_like(x, np.nan)
    rope = np.full((rows, heads, d), np.nan, np.float32)
    ptr, f32, i64 = (lambda a: ctypes.c_void_p(a.ctypes.data)), ctypes.c_float, ctypes.c_int64
    t = ctypes.c_int(threads)
    built.wf_silu_mul(ptr(gate_up), i64(rows), i64(ffn), ptr(silu), t)
    built.wf_rms_norm(ptr(x), ptr(w), f32(1e-5), i64(rows), i64(heads * d), ptr(norm), t)
    sizes = (i64(2 * ffn), i64(0), i64(rows), i64(heads), i64(d))
    built.wf_rope(ptr(gate_up), *sizes, ptr(cos_t), ptr(sin_t), ptr(pos), ptr(rope), t)
    return [silu, norm, rope]


def test_elementwise_steps_built_for_avx2_equal_the_avx512_builds_bit_for_bit(
    haswell: ctypes.CDLL,
) -> None:
    """SiLU(gate) * up (its e^x has an 8-lane form on AVX2, where GCC scalarized the 16-lane
    comparisons), RMS norm and rope, over values from tiny to past e^x's clamps (-87, 88);
    the AVX2 build's rows split over 2 threads, the native one's on one."""
    lib = native.library()
    assert lib is not None
    rng = np.random.default_rng(5)
    rows, ffn = 65, 1536
    scale = np.array([1e-3, 1.0, 30.0, 100.0], np.float32)[rng.integers(0, 4, (rows, 2 * ffn))]
    gate_up = (rng.standard_normal((rows, 2 * ffn)) * scale).astype(np.float32)
    gate_up[0, :8] = [-88, -87, -86.9, 87.9, 88, 89, -1e30, 1e30]
    mine, theirs = elementwise_steps(haswell, gate_up, 2), elementwise_steps(lib, gate_up, 1)
    for name, a, b in zip(("silu_mul", "rms_norm", "rope"), mine, theirs, strict=True):
        assert not np.isnan(a).any(), name
        assert np.array_equal(a, b), f"{name}: the AVX2 build's bits differ"


def test_warmfleet_march_sets_the_build_target_and_what_it_is_called(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """WARMFLEET_MARCH=haswell: the kernels' flags name it, doctor's ISA reads AVX2, and
    chunks of up to 128 rows stay in the kernels' products (longer ones go to BLAS: the
    16-lane vectors are not single registers there) while every chunk attends in the kernel,
    on this AVX-512 CPU; x86-64 alone is plain C, which keeps SMALL_ROWS for both."""
    for target, isa, rows, limit in (
        ("haswell", "AVX2", AVX2_CHUNK_ROWS, None),
        ("x86-64", "no vector", SMALL_ROWS, SMALL_ROWS),
    ):
        monkeypatch.setenv("WARMFLEET_MARCH", target)
        native._target_flags.cache_clear()
        assert f"-march={target}" in native.flags() and "-march=native" not in native.flags()
        assert native.isa().startswith(isa)
        assert not native.wide_vectors()
        assert kernel_chunk_rows() == rows
        assert kernel_row_limit(9, 3, 64) == limit
        assert kernel_row_limit(9, 3, 64, in_place=True) is None  # an MoE model's chunks
    monkeypatch.delenv("WARMFLEET_MARCH")
    native._target_flags.cache_clear()
    assert "-march=native" in native.flags()
    assert native.isa().startswith("AVX-512") and native.wide_vectors()
    assert kernel_row_limit(9, 3, 64) is None
