"""The C kernels built for ARM (aarch64, NEON with the dot-product extension) give the same
bits as this machine's native build: each kernel run by tests/native/kernel_driver.c, built
once against the native library and once with Debian's aarch64 cross compiler (statically,
OpenMP included), the latter under qemu-aarch64, on the same inputs. Speed cannot be
measured here; correctness can. The decoded matrices' products and the expert products
(every type the kernels read; integer and float) and the paged attention over float32,
float16 and q8_0 pools."""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from engine.kv_files.kv_dtypes import Q8_0, quantize
from engine.ops import native
from engine.ops.quant.experts_native import Products
from tests.unit.expert_cases import TYPES, integer, random_experts
from tests.unit.quant_cases import Stored, write_and_read

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "native" / "kernel_driver.c"
CROSS, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
ARM_MARCH = "-march=armv8.2-a+dotprod+fp16"  # Graviton 2 and later, Grace, Apple M1 and later
THREADS = 2
RUN_S = 300  # qemu runs the kernels ~20x slower than the machine

pytestmark = pytest.mark.skipif(
    native.library() is None or not shutil.which(CROSS) or not shutil.which(QEMU),
    reason="needs the C kernels and the aarch64 cross compiler and qemu-aarch64 (./dev test "
    "installs them)",
)


def _compile(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_S)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def drivers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """The command that runs the driver on each build: the native library's, and the
    ARM build's under qemu (its sources compiled at once, then linked)."""
    out = tmp_path_factory.mktemp("drivers")
    lib = Path(str(native.library()._name))  # type: ignore[union-attr]
    cc = os.environ.get("CC") or "cc"
    rpath = f"-Wl,-rpath,{lib.parent}"
    _compile(
        [cc, "-O2", "-o", str(out / "native"), str(DRIVER), str(lib), rpath, "-fopenmp", "-lm"]
    )
    flags = [f if f != "-march=native" else ARM_MARCH for f in native.FLAGS if f != "-shared"]
    sources = [*native.SOURCES, DRIVER]
    objects = [str(out / f"{s.stem}.o") for s in sources]
    jobs = [[CROSS, *flags, "-c", "-o", o, str(s)] for s, o in zip(sources, objects, strict=True)]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(_compile, jobs))
    _compile([CROSS, *flags, "-static", "-o", str(out / "arm"), *objects, "-lm"])
    return {"native": [str(out / "native")], "arm": [QEMU, str(out / "arm")]}


def run_both(drivers: dict[str, list[str]], kernel: str, data: bytes, tmp: Path) -> list[bytes]:
    """The outputs of the kernel on both builds, as bytes."""
    (tmp / "in.bin").write_bytes(data)
    outs = []
    for name, cmd in drivers.items():
        out = tmp / f"{name}.out"
        argv = [*cmd, kernel, str(tmp / "in.bin"), str(out)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_S)
        assert done.returncode == 0, f"{name}: {done.stderr}"
        outs.append(out.read_bytes())
    return outs


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Stored:
    return write_and_read(Path(tmp_path_factory.mktemp("neon")) / "types.gguf")


def test_products_of_decoded_matrices_are_the_same_bits_on_arm(
    drivers: dict[str, list[str]], tmp_path: Path, stored: Stored
) -> None:
    rng = np.random.default_rng(41)
    for qtype, (matrix, _) in stored.items():
        parts = [np.ascontiguousarray(a) for a in (matrix.codes, matrix.scale, matrix.offset)]
        n, k = matrix.shape
        for rows in (1, 5, 17):  # a fused single row, a tile and a tail, several tiles
            x = rng.standard_normal((rows, k)).astype(np.float32)
            header = [matrix.c_kind, matrix.gshift, n, k, rows, THREADS]
            header += [a.nbytes for a in parts]
            data = np.array(header, np.int64).tobytes() + b"".join(a.tobytes() for a in parts)
            native_out, arm_out = run_both(drivers, "matmul", data + x.tobytes(), tmp_path)
            assert len(native_out) == 4 * rows * n
            assert np.frombuffer(native_out, np.float32).any()
            assert native_out == arm_out, f"{qtype.name}, {rows} rows: ARM's bits differ"


@pytest.mark.parametrize("products", [Products.INTEGER, Products.FLOAT], ids=lambda p: p.name)
def test_expert_products_are_the_same_bits_on_arm(
    drivers: dict[str, list[str]], tmp_path: Path, products: Products
) -> None:
    rng = np.random.default_rng(31)
    for qtype in TYPES:
        if products == Products.FLOAT and not integer(qtype, Products.INTEGER):
            continue  # float types multiply one way: run once
        w = random_experts(rng, qtype, e=3, n=21, k=512)
        counts = [0, 1, 6]  # an expert never read, one pair, a few tiles
        rows = np.concatenate([rng.integers(0, 5, c) for c in counts]).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        x = rng.standard_normal((5, w.k)).astype(np.float32)
        header = [int(products), int(qtype), w.num_experts, w.expert_bytes, w.n, w.k, len(x)]
        header += [len(rows), THREADS]
        data = np.array(header, np.int64).tobytes() + w.data.tobytes() + x.tobytes()
        data += rows.tobytes() + starts.tobytes()
        native_out, arm_out = run_both(drivers, "expert", data, tmp_path)
        assert len(native_out) == 4 * len(rows) * w.n
        assert np.frombuffer(native_out, np.float32).any()  # the kernel wrote its outputs
        assert native_out == arm_out, f"{qtype.name} {products.name}: ARM's bits differ"


@pytest.mark.parametrize("kind", [np.dtype(np.float32), np.dtype(np.float16), Q8_0])
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (16, 2, 128)])
def test_paged_attention_is_the_same_bits_on_arm(
    drivers: dict[str, list[str]],
    tmp_path: Path,
    kind: np.dtype,
    heads: int,
    kv_heads: int,
    dim: int,
) -> None:
    rng = np.random.default_rng(37)
    rows, num_blocks, max_blocks = 3, 12, 5
    lengths = np.array([1, 37, 70], np.int32)  # up to 5 blocks of 16
    tables = rng.integers(0, num_blocks, (rows, max_blocks), dtype=np.int32)
    shape = (num_blocks, kv_heads, 16, dim)
    values = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    k, v = (quantize(a) if kind == Q8_0 else a.astype(kind) for a in values)
    q = rng.standard_normal((rows, heads * dim)).astype(np.float32)
    code = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, Q8_0: 2}[kind]
    scale = np.array([dim**-0.5, 0], np.float32).tobytes()
    header = np.array([code, rows, heads, kv_heads, dim, max_blocks, k.nbytes, THREADS], np.int64)
    data = header.tobytes() + scale + q.tobytes() + k.tobytes() + v.tobytes()
    data += tables.tobytes() + lengths.tobytes()
    native_out, arm_out = run_both(drivers, "attention", data, tmp_path)
    assert len(native_out) == 4 * rows * heads * dim
    assert np.frombuffer(native_out, np.float32).any()
    assert native_out == arm_out, "ARM's attention bits differ"
