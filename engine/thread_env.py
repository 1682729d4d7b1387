"""What each process that computes sets before NumPy and Numba load their libraries (the
worker, `generate` and `doctor` through warmfleet/cli.py; the benchmarks and the tests
through their packages): how long the thread pools' idle threads spin, and that freed
arrays stay in the heap. Nothing is imported here but the standard library's ctypes, so
that calling it comes first.

Two thread pools share the cores: OpenBLAS's (long prefill chunks, unless the quantized C
kernels take them: Kernels.chunk_rows) and OpenMP's (the C and Numba kernels). A step that mixes
both calls them in turn, layer after layer, and each pool's idle threads spin after a call:
OpenBLAS's by default for about 2^28 cycles, which took a core from the kernels for every
call and made a mixed step up to three times slower (bench/RESULTS.md). Both are told to
sleep almost at once; a value set in the environment wins. Waking a sleeping thread costs
~0.3-0.5 ms on a VM, which is why quantized weights with the C kernels on AVX-512 keep
prefill off BLAS altogether, and why elsewhere the C kernels call OpenBLAS from their own
threads, its pool held to one thread (engine/ops/blas.py).

A prefill step allocates a few arrays of megabytes a layer (each product's output). glibc's
malloc hands such sizes out as fresh mappings, or gives freed heap back to the system, so
every step paid for the pages again, a fault and a zeroed page each: 7% of a 512-token
prefill's time on AVX2 (bench/RESULTS.md). Below MMAP_THRESHOLD arrays come from the heap,
and up to TRIM_THRESHOLD of freed heap is kept for the next step's (resident memory a
process may hold beyond its arrays).
"""

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (glibc's malloc.h)
MMAP_THRESHOLD = 32 << 20  # the most glibc takes on 64-bit
TRIM_THRESHOLD = 128 << 20


def prepare_process() -> None:
    """Both settings below; the threads' only take effect before NumPy and Numba load their
    libraries."""
    quiet_idle_threads()
    keep_freed_arrays()


def quiet_idle_threads() -> None:
    """Idle BLAS and OpenMP threads sleep almost at once (unless the environment says
    otherwise)."""
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "12")  # spin 2^12 cycles, then sleep
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # OpenMP's default is 300,000


def keep_freed_arrays() -> bool:
    """Arrays below MMAP_THRESHOLD from glibc's heap, which keeps TRIM_THRESHOLD of freed
    memory: whether it was set (not on another C library, nor where GLIBC_TUNABLES sets
    malloc's own values)."""
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
        return False
    return bool(
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
