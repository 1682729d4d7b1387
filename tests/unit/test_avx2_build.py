"""The kernels built for AVX2 give the AVX-512 build's bits. Built with -march=haswell the
16-lane accumulators are two 8-lane halves, summed lane by lane in the same order and joined
by the same tree, so where this machine runs both builds every output must be equal bit for
bit, for every weight type and row count (the tile, its narrower tails, one row)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from engine import native
from engine.quant.native import NativeKernels
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
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, NativeKernels]:
    """The engine's own library (AVX-512 here) and qmatmul.c built for Haswell."""
    assert CC is not None
    out = tmp_path_factory.mktemp("haswell") / "qmatmul-haswell.so"
    flags = [f if f != "-march=native" else "-march=haswell" for f in native.FLAGS]
    source = native.CSRC / "qmatmul.c"
    subprocess.run([CC, *flags, "-o", str(out), str(source)], check=True, timeout=300)
    lib = native.library()
    assert lib is not None
    return {"avx512": NativeKernels(lib), "avx2": NativeKernels(ctypes.CDLL(str(out)))}


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
