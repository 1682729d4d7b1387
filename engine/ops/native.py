"""The engine's C kernels (engine/ops/csrc/*.c), compiled for this machine on first use and
cached: the quantized-weight products and the paged attention of decode rows.

Compiled with -march=native, so the same source becomes AVX2, AVX-512 or NEON code
(WARMFLEET_MARCH names another target: `haswell` builds them for AVX2 without AVX-512, to
measure here what such a CPU runs); the cache key holds the sources, the flags, the
compiler and the CPU's feature flags, so a cached library is never loaded on a machine it
was not built for; a compiler without
OpenMP (Apple's clang) builds them on threads of their own (csrc/par.c). One process compiles,
under a lock file beside the library; the others (a cluster's workers starting together)
wait for it, each showing the progress, and load the same file. A slow compile (a busy
machine: ~25 s on 2 idle cores) is waited for up to BUILD_DEADLINE_S, not given up; a
compile killed half way leaves its lock free and its leftovers to the next, which removes
them and compiles again. Where no C compiler (or no OpenMP) is found, or
WARMFLEET_KERNELS=numba, `library()` is None and the Numba kernels serve (said once, with
what it costs).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)
CSRC = Path(__file__).parent / "csrc"
SOURCES = tuple(sorted(CSRC.glob("*.c")))
HEADERS = tuple(sorted(CSRC.glob("*.h")))
FLAGS = ("-O3", "-march=native", "-std=gnu11", "-fopenmp", "-pthread", "-shared", "-fPIC")
BUILD_DEADLINE_S = 1800.0  # the longest a compile, or the wait for another's, may take
PROGRESS_S = 10.0  # how often a wait for another process's compile says so
LOCK_POLL_S = 0.2
OPTIONAL_HEADERS = ("xxhash.h",)  # built with where found (the key says which were)


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


def march() -> str:
    """The kernels' build target: WARMFLEET_MARCH (a -march value: `haswell` builds them for
    AVX2 without AVX-512), `native` (this CPU) by default."""
    return os.environ.get("WARMFLEET_MARCH") or "native"


def flags(target: str | None = None) -> tuple[str, ...]:
    """FLAGS with -march set to `target` (default march())."""
    target = target or march()
    return tuple(f"-march={target}" if f == "-march=native" else f for f in FLAGS)


# the compiler's macros for a named -march, as /proc/cpuinfo's flags name the features
_MACRO_FLAGS = {
    "__AVX512F__": "avx512f",
    "__AVX512VNNI__": "avx512_vnni",
    "__AVX2__": "avx2",
    "__ARM_NEON": "asimd",
    "__ARM_FEATURE_DOTPROD": "asimddp",
}


@functools.cache
def _target_flags() -> frozenset[str]:
    """The vector features the kernels are built with: this CPU's, or for a named -march
    what the compiler defines for it (none where it cannot say)."""
    if march() == "native":
        return frozenset(_cpu_flags().split())
    cc = _compiler() or "cc"
    argv = [cc, f"-march={march()}", "-dM", "-E", "-x", "c", os.devnull]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    defined = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("#define")}
    return frozenset(flag for macro, flag in _MACRO_FLAGS.items() if macro in defined)


def wide_vectors() -> bool:
    """Whether the kernels' 16-lane vectors are single registers in their build (AVX-512)."""
    return "avx512f" in _target_flags()


def builds_for(feature: str) -> bool:
    """Whether the kernels' build target has `feature` (as /proc/cpuinfo names it: avx2)."""
    return feature in _target_flags()


def isa() -> str:
    """What the kernels' build target makes of their vectors, in words."""
    flags = _target_flags()
    if "avx512f" in flags:
        return "AVX-512 with VNNI" if "avx512_vnni" in flags else "AVX-512"
    if "avx2" in flags:
        return "AVX2 (16-lane vectors as pairs of 8)"
    if "asimd" in flags or (march() == "native" and platform.machine() in ("aarch64", "arm64")):
        return "NEON with dot products" if "asimddp" in flags else "NEON"
    return "no vector extension known to the kernels (plain C)"


def threads(lib: ctypes.CDLL) -> str:
    """Whose threads the compiled kernels run on, in words."""
    return "OpenMP's threads" if lib.wf_openmp() else "threads of their own (no OpenMP)"


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _finds(cc: str, header: str) -> bool:
    """Whether the compiler finds an optional header (a source built without it leaves a
    part out: frame_read.c without xxhash.h)."""
    probe = f"#if __has_include(<{header}>)\nfound\n#endif\n"
    argv = [cc, "-E", "-P", "-x", "c", "-"]
    try:
        done = subprocess.run(argv, input=probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return "found" in done.stdout.split()


def _library_path(cc: str, flags: tuple[str, ...]) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    key = hashlib.blake2b(digest_size=10)
    found = " ".join(h for h in OPTIONAL_HEADERS if _finds(cc, h))
    machine = (version.stdout, platform.machine(), _cpu_flags(), found)
    for part in (*(p.read_bytes() for p in SOURCES + HEADERS), " ".join(flags).encode()):
        key.update(part)
    for text in machine:
        key.update(text.encode())
    return kernel_dir() / f"warmfleet-kernels-{key.hexdigest()}.so"


def built(
    cc: str,
    target: Path,
    sources: tuple[Path, ...],
    flags: tuple[str, ...],
    libs: tuple[str, ...] = (),
) -> Path:
    """`target` compiled from `sources` with `flags` (and linked with `libs` after the
    objects) unless it is there: one process compiles, under the lock file beside it, and
    the others wait for it; a killed compile's leftovers are removed first. TimeoutError
    past BUILD_DEADLINE_S, OSError when the compiler fails."""
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.with_suffix(".lock")):
        if not target.exists():  # else another process built it while this one waited
            for leftover in target.parent.glob(f"{target.stem}.build-*"):
                shutil.rmtree(leftover, ignore_errors=True)
            _compile(cc, target, sources, flags, libs)
    return target


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (the OS frees it if this process dies), waiting for
    another holder up to BUILD_DEADLINE_S and saying so every PROGRESS_S."""
    with path.open("a") as f:
        start = said = time.monotonic()
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - start
                if waited > BUILD_DEADLINE_S:
                    raise TimeoutError(f"another process held {path} for {waited:.0f} s") from None
                if time.monotonic() - said >= PROGRESS_S:
                    said = time.monotonic()
                    log.info("waiting for another process compiling the C kernels (%.0f s)", waited)
                time.sleep(LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _compile(
    cc: str, target: Path, sources: tuple[Path, ...], flags: tuple[str, ...], libs: tuple[str, ...]
) -> None:
    """Each source to an object at once (as many compilers as cores: the build's wall time
    is its slowest source's, not the sum), then one link, renamed into place."""
    what = f"{len(sources)} sources"
    log.info("compiling the engine's C kernels for this machine (once, %s): %s", what, target)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"{target.stem}.build-", dir=target.parent) as tmp:
        objects = [str(Path(tmp) / f"{source.stem}.o") for source in sources]
        jobs = [[cc, *flags, "-c", "-o", o, str(s)] for s, o in zip(sources, objects, strict=True)]
        with ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
            futures = [pool.submit(_run_compiler, job) for job in jobs]
            for n, future in enumerate(as_completed(futures), 1):
                _check(cc, future.result())
                took = time.monotonic() - start
                log.info("compiled %d/%d kernel sources (%.0f s)", n, len(sources), took)
        out = Path(tmp) / target.name
        _check(cc, _run_compiler([cc, *flags, "-o", str(out), *objects, *libs]))
        os.replace(out, target)  # atomic: a reader sees no file or the whole file
    log.info("C kernels compiled in %.0f s", time.monotonic() - start)


class CompilerError(OSError):
    """The C compiler failed; `stderr` is what it said."""

    def __init__(self, cc: str, stderr: str) -> None:
        super().__init__(f"{cc} failed: {stderr.strip()[-2000:]}")
        self.stderr = stderr


def _check(cc: str, done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode:
        raise CompilerError(cc, done.stderr)


def _lacks_openmp(e: CompilerError) -> bool:
    """Whether the compiler failed for want of OpenMP: Apple's clang refuses -fopenmp, a GCC
    without libgomp finds no omp.h or -lgomp."""
    said = e.stderr.lower()
    return "openmp" in said or "omp.h" in said or "gomp" in said


def _run_compiler(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_DEADLINE_S)


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


def library_file(cc: str, build: tuple[str, ...]) -> Path:
    """The kernels' library built with these flags (see built), in kernel_dir()."""
    return built(cc, _library_path(cc, build), SOURCES, build)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels, built if need be; None (the reason logged once) where they
    cannot be had."""
    if os.environ.get("WARMFLEET_KERNELS", "").lower() == "numba":
        return None
    cc = _compiler()
    if cc is None:
        log.warning(
            "no C compiler found (install gcc, or set CC): the engine runs its Numba kernels, "
            "several times slower at decode and prefill than the C kernels (docs/engine.md)"
        )
        return None
    try:
        try:
            return ctypes.CDLL(str(library_file(cc, flags())))
        except CompilerError as e:
            if not _lacks_openmp(e):
                raise
            why = e.stderr.strip().splitlines()[-1][:200]
            log.warning("%s has no OpenMP (%s): the C kernels run on threads of their own", cc, why)
        return ctypes.CDLL(str(library_file(cc, tuple(f for f in flags() if f != "-fopenmp"))))
    except (OSError, subprocess.SubprocessError) as e:  # TimeoutError is an OSError
        log.warning("the C kernels could not be built (%s): using the slower Numba kernels", e)
        return None
