"""The engine's C kernels (engine/ops/csrc/*.c), compiled for this machine on first use and
cached: the quantized-weight products and the paged attention of decode rows.

Compiled with -march=native, so the same source becomes AVX2, AVX-512 or NEON code; the
cache key holds the sources, the flags, the compiler and the CPU's feature flags, so a
cached library is never loaded on a machine it was not built for. Where no C compiler (or
no OpenMP) is found, or WARMFLEET_KERNELS=numba, `library()` is None and the Numba kernels
serve.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)
CSRC = Path(__file__).parent / "csrc"
SOURCES = tuple(sorted(CSRC.glob("*.c")))
HEADERS = tuple(sorted(CSRC.glob("*.h")))
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


def wide_vectors() -> bool:
    """Whether the kernels' 16-lane vectors are single registers here (AVX-512)."""
    return "avx512f" in _cpu_flags().split()


def _library_path(cc: str) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    key = hashlib.blake2b(digest_size=10)
    machine = (version.stdout, platform.machine(), _cpu_flags())
    for part in (*(p.read_bytes() for p in SOURCES + HEADERS), " ".join(FLAGS).encode()):
        key.update(part)
    for text in machine:
        key.update(text.encode())
    return kernel_dir() / f"warmfleet-kernels-{key.hexdigest()}.so"


def _compile(cc: str, target: Path) -> None:
    """Each source to an object at once (as many compilers as cores: the build's wall time
    is its slowest source's, not the sum), then one link."""
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("compiling the engine's C kernels for this machine (once): %s", target)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = [str(Path(tmp) / f"{source.stem}.o") for source in SOURCES]
        jobs = [[cc, *FLAGS, "-c", "-o", o, str(s)] for s, o in zip(SOURCES, objects, strict=True)]
        with ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
            for done in pool.map(_run_compiler, jobs):
                if done.returncode:
                    raise OSError(f"{cc} failed: {done.stderr.strip()[-2000:]}")
        out = Path(tmp) / target.name
        done = _run_compiler([cc, *FLAGS, "-o", str(out), *objects])
        if done.returncode:
            raise OSError(f"{cc} failed: {done.stderr.strip()[-2000:]}")
        os.replace(out, target)  # atomic: workers compiling at once each rename a whole file


def _run_compiler(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)


def address(a: np.ndarray) -> int:
    """The address of a contiguous array's first element, for a kernel's pointer argument:
    through the buffer protocol in a quarter of the time of `a.ctypes.data` (a decode step
    passes about a thousand pointers); read-only or empty arrays take the slow way."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return int(a.ctypes.data)


def scratch_refused(kernel: str, refused_bytes: int, work: str) -> MemoryError:
    """The error to raise where a kernel returned the bytes of scratch it could not allocate
    (it then did nothing): the engine retries the step smaller, and a worker fails the
    step's requests and lives."""
    return MemoryError(
        f"the C kernel {kernel} could not allocate {refused_bytes} bytes of scratch ({work})"
    )


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels, built if need be; None (the reason logged once) where they
    cannot be had."""
    if os.environ.get("WARMFLEET_KERNELS", "").lower() == "numba":
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.warning("no C compiler found: the engine uses its slower Numba kernels")
        return None
    try:
        path = _library_path(cc)
        if not path.exists():
            _compile(cc, path)
        return ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("the C kernels could not be built (%s): using the Numba kernels", e)
        return None
