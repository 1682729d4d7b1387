"""The C kernels built for ARM as Apple's clang builds them (aarch64, NEON with the
dot-product extension, no OpenMP: engine/ops/csrc/par.c's own threads) give the same bits as
this machine's native build with OpenMP: each kernel run by tests/native/kernel_driver.c on
two threads, built once against the native library and once with Debian's aarch64 cross
compiler (statically), the latter under qemu-aarch64, on the same inputs; the ARM build's
parallel kernels run on its own pool of threads. Speed cannot be measured here; correctness
can. The decoded matrices' products and the expert products (every type the kernels read;
integer and float), the paged attention over float32, float16 and q8_0 pools,
SiLU(gate) * up and RMS norm."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.kv_files.kv_dtypes import Q8_0
from engine.ops import native
from engine.ops.quant.experts_native import Products
from tests.native import driver
from tests.native.driver import stored_fixture  # noqa: F401
from tests.unit.quant_cases import Stored

CROSS, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
ARM_MARCH = "armv8.2-a+dotprod+fp16"  # Graviton 2 and later, Grace, Apple M1 and later

pytestmark = pytest.mark.skipif(
    native.library() is None or not shutil.which(CROSS) or not shutil.which(QEMU),
    reason="needs the C kernels and the aarch64 cross compiler and qemu-aarch64 (./dev test "
    "installs them)",
)


@pytest.fixture(scope="module")
def drivers(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[str]]:
    """The native driver, and the ARM build's (no OpenMP) under qemu."""
    out = tmp_path_factory.mktemp("drivers")
    flags = [f for f in native.flags(ARM_MARCH) if f not in ("-shared", "-fopenmp")]
    arm = driver.built_driver(out / "arm", CROSS, flags, ["-static"])
    return driver.native_driver(out / "native"), [QEMU, str(arm)]


def same_bits(drivers: tuple[list[str], list[str]], case: driver.Case, tmp: Path) -> int:
    """Asserts both builds give the case the same bits; the threads ARM's pool started."""
    (mine, openmp_pool), (arm, arm_pool) = (driver.run(cmd, case, tmp) for cmd in drivers)
    assert mine == arm, f"{case.label}: ARM's bits differ"
    assert openmp_pool == 0, f"{case.label}: the native build started a pool of its own"
    return arm_pool


def on_the_pool(drivers: tuple[list[str], list[str]], case: driver.Case, tmp: Path) -> None:
    """Same bits, the ARM build's kernel spread over its own threads."""
    threads = same_bits(drivers, case, tmp)
    assert threads == driver.THREADS - 1, f"{case.label}: ARM's pool started {threads} threads"


def test_products_of_decoded_matrices_are_the_same_bits_on_arm(
    drivers: tuple[list[str], list[str]], tmp_path: Path, stored: Stored
) -> None:
    for case in driver.matmul_cases(stored):
        on_the_pool(drivers, case, tmp_path)


@pytest.mark.parametrize("products", [Products.INTEGER, Products.FLOAT], ids=lambda p: p.name)
def test_expert_products_are_the_same_bits_on_arm(
    drivers: tuple[list[str], list[str]], tmp_path: Path, products: Products
) -> None:
    for case in driver.expert_cases(products):
        on_the_pool(drivers, case, tmp_path)


@pytest.mark.parametrize("kind", [np.dtype(np.float32), np.dtype(np.float16), Q8_0], ids=str)
@pytest.mark.parametrize("heads", [(9, 3, 64), (16, 2, 128)], ids=str)
def test_paged_attention_is_the_same_bits_on_arm(
    drivers: tuple[list[str], list[str]], tmp_path: Path, kind: np.dtype, heads: tuple[int, ...]
) -> None:
    h, hkv, d = heads
    for layout in driver.LAYOUTS:
        for window, sinks in ((0, False), (20, True)):  # and gpt-oss's window and sinks
            case = driver.attention_case(kind, h, hkv, d, window=window, sinks=sinks, layout=layout)
            on_the_pool(drivers, case, tmp_path)


def test_silu_mul_is_the_same_bits_on_arm(
    drivers: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """Its e^x runs in 4-lane NEON vectors there (vec.h's exp4)."""
    on_the_pool(drivers, driver.silu_case(), tmp_path)  # its rows split over the threads


def test_rms_norm_is_the_same_bits_on_arm(
    drivers: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """Its sum of squares in 4-lane multiply-adds there, and hsum's tree."""
    on_the_pool(drivers, driver.rms_norm_case(), tmp_path)
