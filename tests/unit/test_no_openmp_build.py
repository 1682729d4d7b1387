"""The C kernels built without OpenMP (as Apple's clang builds them: engine/ops/csrc/
omp_shim.h, every parallel region on the calling thread) give the same bits as the native
build with OpenMP on two threads: tests/native/kernel_driver.c built both ways, on the same
inputs (decoded matrices' and experts' products, paged attention)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from engine.kv_files.kv_dtypes import Q8_0
from engine.ops import native
from engine.ops.quant.experts_native import Products
from tests.native import driver
from tests.native.driver import stored_fixture  # noqa: F401
from tests.unit.quant_cases import Stored

pytestmark = pytest.mark.skipif(native.library() is None, reason="needs the C kernels")


@pytest.fixture(scope="module")
def drivers(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[str]]:
    """The native driver (OpenMP, two threads), and a build without OpenMP."""
    out = tmp_path_factory.mktemp("drivers")
    flags = [f for f in native.FLAGS if f not in ("-shared", "-fopenmp")]
    alone = driver.built_driver(out / "no-openmp", os.environ.get("CC") or "cc", flags, [])
    return driver.native_driver(out / "native"), [str(alone)]


def test_every_kernel_gives_the_same_bits_without_openmp(
    drivers: tuple[list[str], list[str]], tmp_path: Path, stored: Stored
) -> None:
    cases = [*driver.matmul_cases(stored), *driver.expert_cases(Products.INTEGER)]
    cases += [*driver.expert_cases(Products.FLOAT)]
    kinds = (np.dtype(np.float32), np.dtype(np.float16), Q8_0)
    cases += [
        driver.attention_case(kind, *heads)
        for kind in kinds
        for heads in ((9, 3, 64), (16, 2, 128))
    ]
    for case in cases:
        mine, alone = (driver.outputs(cmd, case, tmp_path) for cmd in drivers)
        assert mine == alone, f"{case.label}: the build without OpenMP differs"
