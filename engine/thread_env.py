"""How long the thread pools' idle threads spin, set by each process that computes (the
worker, `generate` and `doctor` through warmfleet/cli.py; the benchmarks and the tests
through their packages) before NumPy and Numba load their libraries. Nothing is imported
here, so that calling it comes first.

Two thread pools share the cores: OpenBLAS's (long prefill chunks, unless the quantized C
kernels take them: Kernels.chunk_rows) and OpenMP's (the C and Numba kernels). A step that mixes
both calls them in turn, layer after layer, and each pool's idle threads spin after a call:
OpenBLAS's by default for about 2^28 cycles, which took a core from the kernels for every
call and made a mixed step up to three times slower (bench/RESULTS.md). Both are told to
sleep almost at once; a value set in the environment wins. Waking a sleeping thread costs
~0.3-0.5 ms on a VM, which is why quantized weights with the C kernels on AVX-512 keep
prefill off BLAS altogether.
"""

import os


def quiet_idle_threads() -> None:
    """Idle BLAS and OpenMP threads sleep almost at once (unless the environment says
    otherwise); only effective before NumPy and Numba load their libraries."""
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "12")  # spin 2^12 cycles, then sleep
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # OpenMP's default is 300,000
