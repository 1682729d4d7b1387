"""Builds of tests/native/kernel_driver.c (the engine's C kernels run on inputs from a file)
for checking other builds of the kernels bit for bit against the native one, and the inputs
those checks feed them: decoded matrices' products, expert products and paged attention;
and the engine's library built for Haswell (AVX2), which this machine loads beside its own."""

from __future__ import annotations

import ctypes
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from engine.kv_files.kv_dtypes import Q8_0, quantize
from engine.ops import native
from engine.ops.quant.experts_native import Products
from tests.unit.expert_cases import TYPES, integer, random_experts
from tests.unit.quant_cases import Stored, write_and_read

DRIVER = Path(__file__).with_name("kernel_driver.c")
THREADS = 2
RUN_S = 300  # qemu runs the kernels ~20x slower than the machine


def haswell_library() -> ctypes.CDLL:
    """The engine's kernels built for Haswell with its other flags: the library a process
    with WARMFLEET_MARCH=haswell loads (tests/test_avx2_suite.py's), built once (in
    native.kernel_dir()) for every test that compares the AVX2 build."""
    cc = native._compiler()
    assert cc is not None
    return ctypes.CDLL(str(native.library_file(cc, native.flags("haswell"))))


@dataclass(frozen=True, slots=True)
class Case:
    label: str
    kernel: str  # the driver's first argument
    data: bytes
    outputs: int  # float32 values it writes


def _compile(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_S)
    if done.returncode:
        raise AssertionError(done.stderr[-3000:])


@pytest.fixture(scope="module", name="stored")
def stored_fixture(tmp_path_factory: pytest.TempPathFactory) -> Stored:
    """A decoded matrix of each type (tests/unit/quant_cases.py)."""
    return write_and_read(Path(tmp_path_factory.mktemp("matrices")) / "types.gguf")


def native_driver(out: Path) -> list[str]:
    """The driver linked against the engine's own compiled kernels."""
    lib = Path(str(native.library()._name))  # type: ignore[union-attr]
    cc, rpath = os.environ.get("CC") or "cc", f"-Wl,-rpath,{lib.parent}"
    _compile([cc, "-O2", "-o", str(out), str(DRIVER), str(lib), rpath, "-fopenmp", "-lm"])
    return [str(out)]


def built_driver(
    out: Path, cc: str, flags: list[str], link: list[str], sources: list[Path] | None = None
) -> Path:
    """The driver and the kernels' sources compiled with `flags` as the engine compiles its
    own (native.built: the sources at once), linked with `link` added; or, given `sources`,
    those alone (a library where `flags` says -shared)."""
    sources = [*native.SOURCES, DRIVER] if sources is None else sources
    return native.built(cc, out, tuple(sources), (*flags, *link), libs=("-lm",))


def outputs(cmd: list[str], case: Case, tmp: Path) -> bytes:
    """What the driver `cmd` writes for the case (its length checked, not all zeros)."""
    return run(cmd, case, tmp)[0]


def run(cmd: list[str], case: Case, tmp: Path) -> tuple[bytes, int]:
    """What the driver `cmd` writes for the case (its length checked, not all zeros), and
    the threads the kernels' own pool started for it (par.h: 0 in an OpenMP build)."""
    (tmp / "in.bin").write_bytes(case.data)
    out = tmp / "out.bin"
    argv = [*cmd, case.kernel, str(tmp / "in.bin"), str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_S)
    assert done.returncode == 0, f"{case.label}: {done.stderr}"
    said = done.stdout.split("pool threads: ")
    assert len(said) == 2, f"{case.label}: the driver did not say its threads: {done.stdout!r}"
    return _checked(case, out.read_bytes()), int(said[1])


def _checked(case: Case, got: bytes) -> bytes:
    assert len(got) == 4 * case.outputs and np.frombuffer(got, np.float32).any(), case.label
    return got


def matmul_cases(stored: Stored) -> Iterator[Case]:
    """Each type's decoded matrix against a fused single row, a tile and a tail, tiles."""
    rng = np.random.default_rng(41)
    for qtype, (matrix, _) in stored.items():
        parts = [np.ascontiguousarray(a) for a in (matrix.codes, matrix.scale, matrix.offset)]
        n, k = matrix.shape
        for rows in (1, 5, 17):
            x = rng.standard_normal((rows, k)).astype(np.float32)
            header = [matrix.c_kind, matrix.gshift, n, k, rows, THREADS, *(a.nbytes for a in parts)]
            data = np.array(header, np.int64).tobytes() + b"".join(a.tobytes() for a in parts)
            yield Case(f"{qtype.name}, {rows} rows", "matmul", data + x.tobytes(), rows * n)


def expert_cases(products: Products) -> Iterator[Case]:
    """Each type's experts (3 of [21, 512]) with an empty, a one-pair and a 6-pair bucket."""
    rng = np.random.default_rng(31)
    for qtype in TYPES:
        if products == Products.FLOAT and not integer(qtype, Products.INTEGER):
            continue  # float types multiply one way: run once
        w = random_experts(rng, qtype, e=3, n=21, k=512)
        counts = [0, 1, 6]
        rows = np.concatenate([rng.integers(0, 5, c) for c in counts]).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        x = rng.standard_normal((5, w.k)).astype(np.float32)
        header = [int(products), int(qtype), w.num_experts, w.expert_bytes, w.n, w.k, len(x)]
        data = np.array([*header, len(rows), THREADS], np.int64).tobytes()
        data += w.data.tobytes() + x.tobytes() + rows.tobytes() + starts.tobytes()
        yield Case(f"{qtype.name} {products.name}", "expert", data, len(rows) * w.n)


def silu_case() -> Case:
    """SiLU(gate) * up over values from tiny to past e^x's clamps (-87, 88), rows enough for
    the driver's 2 threads to split them (elementwise.c's SPLIT_FLOATS)."""
    rng = np.random.default_rng(43)
    rows, ffn = 520, 64
    scale = np.array([1e-3, 1.0, 30.0, 100.0], np.float32)[rng.integers(0, 4, (rows, 2 * ffn))]
    gate_up = (rng.standard_normal((rows, 2 * ffn)) * scale).astype(np.float32)
    gate_up[0, :8] = [-88, -87, -86.9, 87.9, 88, 89, -1e30, 1e30]
    data = np.array([rows, ffn], np.int64).tobytes() + gate_up.tobytes()
    return Case("silu_mul", "silu", data, rows * ffn)


def rms_norm_case() -> Case:
    """RMS norm of rows from tiny to large values (its sum of squares: hsum's tree), rows
    enough to be split over the driver's 2 threads."""
    rng = np.random.default_rng(47)
    rows, dim = 60, 576
    scale = np.array([1e-3, 1.0, 30.0, 1e4], np.float32)[rng.integers(0, 4, (rows, 1))]
    x = (rng.standard_normal((rows, dim)) * scale).astype(np.float32)
    w = rng.standard_normal(dim).astype(np.float32)
    data = np.array([rows, dim], np.int64).tobytes() + x.tobytes() + w.tobytes()
    return Case("rms_norm", "rms_norm", data, rows * dim)


LAYOUTS = ("3 rows", "5 rows", "a chunk of 5")  # the kernel's task kinds at two threads


def attention_case(
    kind: np.dtype,
    heads: int,
    kv_heads: int,
    dim: int,
    window: int = 0,
    sinks: bool = False,
    layout: str = LAYOUTS[0],
) -> Case:
    """Rows over a pool of `kind` (float32, float16, q8_0), each seeing its last `window`
    only where window > 0, with a sink logit per head where `sinks` (gpt-oss's attention).
    The layout picks the kernel's tasks: 3 rows of 1, 37 and 70 keys, a (row, KV head) each;
    5 rows, a whole row each; a chunk of 5 (one table, 66-70 keys), runs of its rows."""
    rng = np.random.default_rng(37)
    num_blocks, max_blocks = 12, 5
    lengths = np.array(
        {"3 rows": [1, 37, 70], "5 rows": [1, 20, 37, 53, 70]}.get(layout, range(66, 71)),
        np.int32,
    )  # up to 5 blocks of 16
    rows = len(lengths)
    tables = rng.integers(0, num_blocks, (rows, max_blocks), dtype=np.int32)
    if layout == LAYOUTS[2]:
        tables[:] = tables[0]
    shape = (num_blocks, kv_heads, 16, dim)
    values = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    k, v = (quantize(a) if kind == Q8_0 else a.astype(kind) for a in values)
    q = rng.standard_normal((rows, heads * dim)).astype(np.float32)
    code = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, Q8_0: 2}[kind]
    scale = np.array([dim**-0.5, 0], np.float32).tobytes()
    header = np.array([code, rows, heads, kv_heads, dim, max_blocks, k.nbytes, THREADS], np.int64)
    limits = np.array([window, int(sinks)], np.int64).tobytes()
    data = header.tobytes() + scale + limits + q.tobytes() + k.tobytes() + v.tobytes()
    data += tables.tobytes() + lengths.tobytes()
    if sinks:
        data += rng.uniform(-2.0, 4.0, heads).astype(np.float32).tobytes()
    label = f"{kind} {heads}/{kv_heads}x{dim} window {window} sinks {sinks} {layout}"
    return Case(label, "attention", data, rows * heads * dim)
