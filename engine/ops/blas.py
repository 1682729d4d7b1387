"""The process's BLAS thread pool (NumPy's, through threadpoolctl), and its sgemm as the C
kernels call it from their own threads (engine/ops/csrc/blas_chunks.c).

Where they do, BLAS is held to one thread for the process's life: its calls then run on the
calling kernel thread, and no step hands the cores from one thread pool to the other (each
hand-over woke the other pool's sleeping thread; see blas_chunks.c). Elsewhere a step that
sends a long chunk to BLAS gives it the configured threads, and one that does not, one
(engine/device.py: threads_for_step)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from threadpoolctl import ThreadpoolController

# CBLAS sgemm's names in the OpenBLAS builds NumPy ships or links, and whether their
# integers are 64-bit
SGEMM_NAMES = (
    ("scipy_cblas_sgemm64_", True),  # NumPy's wheels (scipy-openblas64)
    ("cblas_sgemm64_", True),
    ("scipy_cblas_sgemm", False),
    ("cblas_sgemm", False),
)


@dataclass(frozen=True, slots=True)
class Sgemm:
    address: int  # of the C function
    ilp64: bool  # its integers are 64-bit


class BlasPool:
    """The process's BLAS thread count, switched per step at the cost of one C call."""

    def __init__(self) -> None:
        controllers = ThreadpoolController().select(user_api="blas").lib_controllers
        self._lib = controllers[0] if controllers else None
        self.configured = self._lib.num_threads if self._lib else 1
        self._current = self.configured
        self._held = False  # the kernels call its sgemm: one thread from then on

    def configure(self, n: int) -> None:
        """The thread count a step with a long chunk gives BLAS (set_threads)."""
        self.configured = n
        self._current = -1  # unknown: threadpool_limits may have changed it
        self.use(n)

    def use(self, n: int) -> None:
        n = 1 if self._held else n
        if self._lib is not None and n != self._current:
            self._lib.set_num_threads(n)
            self._current = n

    def sgemm_for_kernels(self) -> Sgemm | None:
        """The library's sgemm for the kernels' threads to call, its pool held to one thread
        from now on; None where it is no OpenBLAS (Accelerate, MKL: left to NumPy)."""
        if self._lib is None or self._lib.internal_api != "openblas":
            return None
        for name, ilp64 in SGEMM_NAMES:
            fn = getattr(self._lib.dynlib, name, None)
            if fn is not None:
                self._held = True
                self.use(1)
                return Sgemm(ctypes.cast(fn, ctypes.c_void_p).value or 0, ilp64)
        return None


POOL = BlasPool()  # process-wide, like the thread pool it controls
