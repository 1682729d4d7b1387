"""The C kernels take their scratch before they start: where it cannot be allocated they
raise MemoryError and leave their output as it was, instead of crashing the worker on a
NULL pointer (or a stack overflow), and the same process computes with them once memory is
back. Run in a child process under an address-space limit (RLIMIT_AS) that leaves room for
the inputs but not for the scratch, which the inputs size: long block tables whose entries
all name one block, or long weight rows of zero pages (allocated, never touched)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.ops import native

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler here")

# The address space in use now plus this: room for Python to raise and print, not for
# scratch of hundreds of MB.
LIMIT = """
import resource

def limited():
    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (size + (64 << 20), resource.RLIM_INFINITY))

def unlimited():
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

def attempt(name, call, untouched):
    try:
        call()
        print(name, "no error")
    except MemoryError as e:
        print(name, "MemoryError", e, "|", "untouched" if untouched() else "written")
"""

KERNELS = LIMIT + textwrap.dedent(
    """
    import gguf
    import numpy as np
    from engine.ops.attention_rows import rows_kernel
    from engine.ops.quant import native
    from engine.ops.quant.formats import KIND_Q8, decode
    from engine.ops.quant.matrix import QuantMatrix

    H, HKV, D, BLOCK = 9, 3, 64, 16
    rng = np.random.default_rng(0)
    k, v = (rng.standard_normal((1, HKV, BLOCK, D)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    attend, kernels = rows_kernel(), native.load()
    out = np.empty_like(q)
    attend(q, k, v, np.zeros((1, 4), np.int32), np.array([64], np.int32), D**-0.5, out)
    # 4M keys, every block of the table the same one: each thread's scores take 100s of MB
    keys = 1 << 22
    tables = np.zeros((1, keys // BLOCK), np.int32)
    # a product of 2 rows with K = 4M: each thread dequantizes 4 weight rows of K floats
    K = 1 << 22
    raw = gguf.quants.quantize(rng.standard_normal((1, K)).astype(np.float32),
                               gguf.GGMLQuantizationType.Q8_0)
    w = QuantMatrix.from_decoded(decode(raw, gguf.GGMLQuantizationType.Q8_0), "Q8_0")
    x = rng.standard_normal((2, K)).astype(np.float32)
    product = np.full((2, 1), np.nan, np.float32)
    # a row of 128M weights with float16 groups: 4 threads widen 32 MB of groups each
    long_k = 1 << 27
    groups = np.ones((1, long_k // 32), np.float16)
    long_row = QuantMatrix(KIND_Q8, 32, np.zeros((1, long_k), np.uint8), groups, groups,
                           long_k, "Q8_0")
    row = np.zeros((1, long_k), np.float32)
    first = np.zeros(1, np.int64)

    limited()
    out[:] = np.nan
    attempt("attention:", lambda: attend(q, k, v, tables, np.array([keys], np.int32),
                                         D**-0.5, out), lambda: np.isnan(out).all())
    attempt("product:", lambda: kernels.matmul(w, x, product, 2),
            lambda: np.isnan(product).all())
    attempt("dequant:", lambda: kernels.dequant(long_row, first, row, 4),
            lambda: not row.any())
    unlimited()
    kernels.matmul(w, x, product, 2)  # with room, the same calls compute
    dense = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0)
    close = np.allclose(product, x.astype(np.float64) @ dense.T, rtol=1e-3, atol=1e-2)
    print("product after:", "close" if close else "wrong")
    row = np.empty((1, K), np.float32)
    kernels.dequant(w, first, row, 4)
    print("dequant after:", "equal" if np.array_equal(row, dense) else "wrong")
    """
)

LAYERS = LIMIT + textwrap.dedent(
    """
    import dataclasses
    import tempfile
    from pathlib import Path

    import gguf
    import numpy as np
    from engine.model import Model
    from engine.ops.native_layers import NativeLayers
    from tests.paged import new_kv, pool_of, step
    from tests.tiny_gguf import write_tiny_llama

    path = write_tiny_llama(Path(tempfile.mkdtemp()) / "m.gguf", dim=256, num_heads=8,
                            num_kv_heads=2, ffn_dim=256,
                            matrix_type=gguf.GGMLQuantizationType.Q8_0)
    model = Model.load(path, device="cpu", weights="quantized")
    calls, run = [], NativeLayers.run
    NativeLayers.run = lambda *args: calls.append(args) or run(*args)
    parts = [(new_kv(model), [3, 4, 5]), (new_kv(model), [6])]
    want = step(model, parts)
    assert len(calls) == 1 and calls[0][-2].attention.lengths.size == 4, "not one C call"
    layers, x, positions, rope, pool, layout, threads = calls[0]
    # every row over 4M keys, all in one block: each thread's scores take 100s of MB
    keys, plan = 1 << 22, layout.attention
    long = dataclasses.replace(plan, tables=np.zeros((4, keys // 16), np.int32),
                               lengths=np.full(4, keys, np.int32))
    layout = dataclasses.replace(layout, group_plans=(long,))
    x, pool_k, pool_v = np.full_like(x, np.nan), pool.k.copy(), pool.v.copy()

    limited()
    attempt("layers:", lambda: run(layers, x, positions, rope, pool, layout, threads),
            lambda: np.isnan(x).all() and (pool.k == pool_k).all() and (pool.v == pool_v).all())
    unlimited()
    print("layers after:", "equal" if np.array_equal(step(model, parts), want) else "wrong")
    """
)


def _child(script: str) -> list[str]:
    child = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=Path(__file__).parents[2],
    )
    assert child.returncode == 0, (child.returncode, child.stderr[-3000:])
    return child.stdout.splitlines()


def test_kernels_raise_memory_error_when_their_scratch_cannot_be_allocated() -> None:
    attention, product, dequant, product_after, dequant_after = _child(KERNELS)
    assert attention.startswith("attention: MemoryError the C kernel wf_paged_rows could not")
    assert product.startswith("product: MemoryError the C kernel wf_matmul could not allocate")
    assert dequant.startswith("dequant: MemoryError the C kernel wf_dequant could not allocate")
    # 4 threads x 2 x 4M float16 groups widened to float32
    assert f"allocate {4 * 2 * (1 << 22) * 4} bytes" in dequant, dequant
    for line in (attention, product, dequant):
        assert line.endswith("| untouched"), line
    assert product_after == "product after: close"
    assert dequant_after == "dequant after: equal"


def test_the_one_call_layers_raise_memory_error_and_run_again() -> None:
    layers, after = _child(LAYERS)
    assert layers.startswith("layers: MemoryError the C kernel wf_layers could not allocate")
    assert layers.endswith("| untouched"), layers
    assert after == "layers after: equal"
