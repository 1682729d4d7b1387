"""The C kernels take their scratch before they start: where it cannot be allocated they
raise MemoryError and leave their output as it was, instead of crashing the worker on a
NULL pointer. Run in a child process under an address-space limit (RLIMIT_AS) that leaves
room for the inputs but not for the scratch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from engine import native

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler here")

CHILD = textwrap.dedent(
    """
    import resource
    import gguf
    import numpy as np
    from engine.attention import _paged_rows_kernel
    from engine.quant import native
    from engine.quant.formats import decode
    from engine.quant.matrix import QuantMatrix

    H, HKV, D, BLOCK = 9, 3, 64, 16
    rng = np.random.default_rng(0)
    k, v = (rng.standard_normal((1, HKV, BLOCK, D)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    attend, kernels = _paged_rows_kernel(), native.load()
    # 4M keys, every block of the table the same one: the inputs are small, the scores'
    # scratch (each thread's heads x keys) is hundreds of MB
    keys = 1 << 22
    tables = np.zeros((1, keys // BLOCK), np.int32)
    short = np.zeros((1, 4), np.int32)
    out = np.empty_like(q)
    attend(q, k, v, short, np.array([64], np.int32), D**-0.5, out)  # the threads started
    # a product of 2 rows with K = 4M: each thread dequantizes 4 weight rows of K floats
    K = 1 << 22
    raw = gguf.quants.quantize(rng.standard_normal((1, K)).astype(np.float32),
                               gguf.GGMLQuantizationType.Q8_0)
    w = QuantMatrix.from_decoded(decode(raw, gguf.GGMLQuantizationType.Q8_0), "Q8_0")
    x = rng.standard_normal((2, K)).astype(np.float32)
    product = np.full((2, 1), np.nan, np.float32)

    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (size + (64 << 20), resource.RLIM_INFINITY))
    out[:] = np.nan
    try:
        attend(q, k, v, tables, np.array([keys], np.int32), D**-0.5, out)
        print("attention: no error")
    except MemoryError as e:
        print("attention: MemoryError", e, "untouched" if np.isnan(out).all() else "written")
    try:
        kernels.matmul(w, x, product, 2)
        print("product: no error")
    except MemoryError as e:
        print("product: MemoryError", e, "untouched" if np.isnan(product).all() else "written")
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    kernels.matmul(w, x, product, 2)  # with room, the same call computes
    dense = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0)
    close = np.allclose(product, x.astype(np.float64) @ dense.T, rtol=1e-3, atol=1e-2)
    print("product after:", "close" if close else "wrong")
    """
)


def test_kernels_raise_memory_error_when_their_scratch_cannot_be_allocated() -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300, check=False
    )
    assert child.returncode == 0, child.stderr[-3000:]
    lines = child.stdout.splitlines()
    assert lines[0].startswith("attention: MemoryError no memory for the attention scratch")
    assert lines[0].endswith("untouched"), lines[0]
    assert lines[1].startswith("product: MemoryError no memory for the scratch of a 2-row")
    assert lines[1].endswith("untouched"), lines[1]
    assert lines[2] == "product after: close", lines
