"""`warmfleet doctor`'s machine rows: Python, NumPy and its BLAS, the C kernels, CuPy, CUDA
and the GPU, MLX. Each function returns rows; none raises for a missing part."""

from __future__ import annotations

import importlib
import logging
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import numpy as np
from threadpoolctl import threadpool_info

from engine.ops import native
from engine.ops.chunks import kernel_attention_rows, kernel_chunk_rows
from engine.ops.quant import kernels as quant_kernels
from warmfleet.doctor_report import Check, fail, info, ok, skipped
from warmfleet.sizes import format_size

GPU_EXTRA = "pip install 'warmfleet[gpu]'"
MLX_EXTRA = "pip install 'warmfleet[mlx]'"


def python_row() -> Check:
    impl, version = platform.python_implementation(), platform.python_version()
    where = f"{platform.system()} {platform.machine()}"
    return ok("python", f"{impl} {version} on {where}", version=version,
              platform=sys.platform, machine=platform.machine())  # fmt: skip


def numpy_row() -> Check:
    blas = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    if not blas:
        return info("numpy", f"{np.__version__}; no BLAS library seen", version=np.__version__)
    b = blas[0]
    lib = f"{b.get('internal_api')} {b.get('version')}"
    arch = f", {b['architecture']}" if b.get("architecture") else ""
    return ok("numpy", f"{np.__version__}; BLAS {lib} ({b.get('num_threads')} threads{arch})",
              version=np.__version__, blas=lib, blas_threads=b.get("num_threads"))  # fmt: skip


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def kernels_row() -> Check:
    """Whether the C kernels build (or are cached) here; the reason native.py gives if not."""
    collect = _Collect()
    logger = logging.getLogger(native.__name__)
    logger.addHandler(collect)
    try:
        lib = native.library()
    finally:
        logger.removeHandler(collect)
    if lib is not None:
        target = "this CPU" if native.march() == "native" else f"-march={native.march()}"
        threads, rows, attends = native.threads(lib), kernel_chunk_rows(), kernel_attention_rows()
        chunks = "every prefill chunk" if rows is None else f"prefill chunks up to {rows} rows"
        if attends is None and rows is not None:  # AVX2: past `rows`, BLAS products only
            chunks += ", attention every chunk"
        blas_on_kernels = quant_kernels().blas is not None  # BLAS called from their threads
        if rows is not None:
            chunks += ", BLAS on their threads" if blas_on_kernels else ", BLAS on NumPy's"
        what = f"built for {target} ({native.isa()}, {threads}; {chunks}): {lib._name}"
        return ok(
            "C kernels",
            what,
            library=str(lib._name),
            isa=native.isa(),
            threads=threads,
            chunk_rows=rows,
            attention_rows=attends,
            blas_on_kernel_threads=blas_on_kernels,
        )
    if os.environ.get("WARMFLEET_KERNELS", "").lower() == "numba":
        why = "off (WARMFLEET_KERNELS=numba)"
    else:  # native.py logs why, once per process
        why = collect.messages[-1] if collect.messages else "not built earlier in this process"
    return info("C kernels", f"not used: {why}", library=None)


@dataclass(frozen=True, slots=True)
class GpuProbe:
    """What CuPy says about this machine; `why` (a few words) and `error` (what CuPy raised)
    are set, and the device fields empty, when there is no usable GPU."""

    why: str = ""
    error: str = ""
    cupy_version: str = ""
    runtime_version: int = 0
    driver_version: int = 0
    num_devices: int = 0
    name: str = ""
    compute_capability: str = ""
    total_bytes: int = 0
    free_bytes: int = 0
    integrated: bool = False

    @property
    def found(self) -> bool:
        return not self.why


def probe_gpu(import_module: Callable[[str], ModuleType] = importlib.import_module) -> GpuProbe:
    """Ask CuPy for its CUDA versions and device 0; never raises."""
    try:
        cupy = import_module("cupy")
    except Exception as e:  # not installed, or its CUDA libraries missing
        return GpuProbe(why="CuPy is not installed", error=f"{type(e).__name__}: {e}")
    runtime = cupy.cuda.runtime
    found = GpuProbe(cupy_version=str(getattr(cupy, "__version__", "?")),
                     runtime_version=_version_or_0(runtime.runtimeGetVersion),
                     driver_version=_version_or_0(runtime.driverGetVersion))  # fmt: skip
    try:
        count = int(runtime.getDeviceCount())
        if count < 1:
            return replace(found, why="CuPy sees no CUDA device", error="device count 0")
        return _with_device(found, cupy, count)
    except Exception as e:  # no driver, no device, a driver too old for the runtime
        return replace(found, why="CuPy sees no CUDA device", error=f"{type(e).__name__}: {e}")


def _version_or_0(call: Callable[[], int]) -> int:
    try:
        return int(call())
    except Exception:  # no runtime library or no driver: said by the device row
        return 0


def _with_device(found: GpuProbe, cupy: Any, count: int) -> GpuProbe:
    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props.get("name", b"?")
    device = cupy.cuda.Device(0)
    free, total = device.mem_info
    return replace(
        found,
        num_devices=count,
        name=name.decode() if isinstance(name, bytes) else str(name),
        compute_capability=str(device.compute_capability),
        total_bytes=int(total),
        free_bytes=int(free),
        integrated=bool(props.get("integrated", 0)),
    )


def cuda_version(v: int) -> str:
    """CUDA's integer version as major.minor: 12040 -> "12.4", 13000 -> "13.0"."""
    return f"{v // 1000}.{v % 1000 // 10}"


def capability(cc: str) -> str:
    """CuPy's compute capability string as major.minor: "90" -> "9.0", "121" -> "12.1"."""
    return f"{cc[:-1]}.{cc[-1]}" if len(cc) >= 2 else cc


def gpu_rows(probe: GpuProbe, required: bool) -> list[Check]:
    """CuPy, CUDA, device and memory rows. Without a GPU the row where it stops says why: a
    failure when a GPU was `required` (--device cuda), else information."""
    if not probe.found:
        return _no_gpu_rows(probe, fail if required else info)
    p = probe
    shared = ", shared with the CPU" if p.integrated else ""
    return [
        ok("cupy", p.cupy_version, version=p.cupy_version),
        _cuda_row(p, ok),
        ok("device", f"{p.name}, compute capability {capability(p.compute_capability)} "
           f"(device 0 of {p.num_devices})", name=p.name,
           compute_capability=capability(p.compute_capability), num_devices=p.num_devices),
        ok("device memory", f"{format_size(p.total_bytes)} total, {format_size(p.free_bytes)} "
           f"free{shared}", total_bytes=p.total_bytes, free_bytes=p.free_bytes,
           integrated=p.integrated),
    ]  # fmt: skip


def _cuda_row(p: GpuProbe, row: Callable[..., Check]) -> Check:
    """The CUDA runtime CuPy was built for and the newest CUDA the driver supports (0: none
    seen)."""
    runtime = cuda_version(p.runtime_version) if p.runtime_version else "not found"
    driver = cuda_version(p.driver_version) if p.driver_version else "no driver"
    return row("cuda", f"runtime {runtime}, driver supports {driver}", runtime=runtime,
               driver=driver)  # fmt: skip


def _no_gpu_rows(probe: GpuProbe, missing: Callable[..., Check]) -> list[Check]:
    if not probe.cupy_version:
        return [missing("cupy", f"no GPU: {probe.why} ({probe.error}); {GPU_EXTRA}"),
                *(skipped(n, "no GPU") for n in ("cuda", "device", "device memory"))]  # fmt: skip
    return [
        ok("cupy", probe.cupy_version, version=probe.cupy_version),
        _cuda_row(probe, info),
        missing("device", f"no GPU: {probe.why} ({probe.error})"),
        skipped("device memory", "no GPU"),
    ]


@dataclass(frozen=True, slots=True)
class MlxProbe:
    """What MLX says about this machine: its version and default device ("gpu": Metal on
    Apple silicon; "cpu": its CPU build), or why it cannot be used."""

    version: str = ""
    device: str = ""
    why: str = ""

    @property
    def found(self) -> bool:
        return not self.why

    @property
    def on_gpu(self) -> bool:
        return self.device == "gpu"


def probe_mlx(import_module: Callable[[str], ModuleType] = importlib.import_module) -> MlxProbe:
    """Ask MLX for its version and default device; never raises."""
    try:
        mx = import_module("mlx.core")
        device = mx.default_device()
    except Exception as e:  # not installed, or its libraries missing
        return MlxProbe(why=f"MLX is not installed ({type(e).__name__}: {e})")
    kind = "gpu" if device.type == mx.DeviceType.gpu else "cpu"
    return MlxProbe(version=str(getattr(mx, "__version__", "?")), device=kind)


def mlx_row(probe: MlxProbe, required: bool) -> Check:
    """MLX's version and where it computes; without it, a failure when it was `required`
    (--device mlx), else information."""
    if not probe.found:
        return (fail if required else info)("mlx", f"{probe.why}; {MLX_EXTRA}")
    where = "Metal (the GPU)" if probe.on_gpu else "its CPU build (no Metal here)"
    return ok("mlx", f"{probe.version}, computing on {where}", version=probe.version,
              device=probe.device)  # fmt: skip
