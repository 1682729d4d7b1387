"""The C kernels of qmatmul.c, compiled for this machine on first use and cached.

Compiled with -march=native, so the same source becomes AVX2, AVX-512 or NEON code; the
cache key holds the source, the flags, the compiler and the CPU's feature flags, so a
cached library is never loaded on a machine it was not built for. Where no C compiler (or
no OpenMP) is found, `load()` returns None and the Numba kernels of fallback.py serve.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from engine.quant.matrix import QuantMatrix

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("qmatmul.c")
FLAGS = ("-O3", "-march=native", "-std=gnu11", "-fopenmp", "-shared", "-fPIC")
COMPILE_TIMEOUT_S = 120.0


def kernel_dir() -> Path:
    return Path(
        os.environ.get("WARMFLEET_KERNEL_DIR") or Path.home() / ".cache" / "warmfleet" / "kernels"
    )


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def _library_path(cc: str) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    key = hashlib.blake2b(digest_size=10)
    for part in (SOURCE.read_bytes(), " ".join(FLAGS).encode(), version.stdout.encode(),
                 platform.machine().encode(), _cpu_flags().encode()):  # fmt: skip
        key.update(part)
    return kernel_dir() / f"qmatmul-{key.hexdigest()}.so"


def _compile(cc: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("compiling the quantized-weight kernels for this machine (once): %s", target)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        done = subprocess.run([cc, *FLAGS, "-o", str(out), str(SOURCE)], capture_output=True,
                              text=True, timeout=COMPILE_TIMEOUT_S)  # fmt: skip
        if done.returncode:
            raise OSError(f"{cc} failed: {done.stderr.strip()[-2000:]}")
        os.replace(out, target)  # atomic: workers compiling at once each rename a whole file


class NativeKernels:
    """ctypes bindings of wf_matmul and wf_dequant."""

    name = "c"

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        p, i, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        self._matmul = lib.wf_matmul
        self._matmul.argtypes = [i, i, p, p, p, i64, i64, p, i64, p, i64, i]
        self._matmul.restype = None
        self._dequant = lib.wf_dequant
        self._dequant.argtypes = [i, i, p, p, p, i64, p, i64, p, i]
        self._dequant.restype = None

    def matmul(self, w: QuantMatrix, x: np.ndarray, out: np.ndarray, threads: int) -> None:
        """out[M, N] = x[M, K] @ w.T; x and out C-contiguous float32."""
        codes, scale, offset = w.pointers
        self._matmul(w.kind, w.gshift, codes, scale, offset, out.shape[1], w.k,
                     x.ctypes.data, x.shape[0], out.ctypes.data, out.shape[1], threads)  # fmt: skip

    def dequant(self, w: QuantMatrix, rows: np.ndarray, out: np.ndarray, threads: int) -> None:
        """out[i] = row rows[i] of w as float32; rows int64, out [len(rows), K]."""
        codes, scale, offset = w.pointers
        self._dequant(w.kind, w.gshift, codes, scale, offset, w.k, rows.ctypes.data,
                      len(rows), out.ctypes.data, threads)  # fmt: skip


def load() -> NativeKernels | None:
    """The compiled kernels, building them if needed; None (with the reason logged) where
    no compiler is found or it fails."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.warning("no C compiler found: quantized weights use the slower Numba kernels")
        return None
    try:
        path = _library_path(cc)
        if not path.exists():
            _compile(cc, path)
        return NativeKernels(path)
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("the C kernels could not be built (%s): using the Numba kernels", e)
        return None
