"""Choose the array module: NumPy on the CPU, CuPy where a GPU is present and asked for,
MLX (engine/mlx_backend) where asked for or on Apple silicon."""

from __future__ import annotations

import importlib
import os
import platform
from types import ModuleType
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from common.enums import DEVICES
from common.errors import InvalidRequestError
from engine.ops import blas, kernels

DTYPES = {"float32": np.float32, "float16": np.float16}


def cupy_with_gpu() -> ModuleType | None:
    try:
        cupy = importlib.import_module("cupy")
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # not installed, or no driver / device
        return None


def _mlx() -> ModuleType | None:
    try:
        return importlib.import_module("mlx.core")
    except ImportError:
        return None


def apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def array_module(device: str) -> ModuleType:
    """numpy for "cpu"; cupy for "cuda" and mlx.core for "mlx" (an error if unusable);
    "auto" picks cupy if it works, else MLX on Apple silicon, else numpy."""
    if device not in DEVICES:
        raise InvalidRequestError("device", f"must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cpu":
        return np
    if device == "mlx" or (device == "auto" and apple_silicon()):
        mlx = _mlx()
        if mlx is not None:
            return mlx
        if device == "mlx":
            raise InvalidRequestError(
                "device",
                "mlx asked for, but mlx is not installed "
                "(install the extra: pip install 'warmfleet[mlx]')",
            )
    cupy = cupy_with_gpu()
    if cupy is not None:
        return cupy
    if device == "cuda":
        raise InvalidRequestError(
            "device",
            "cuda asked for, but cupy is not installed or sees no GPU "
            "(install the extra: pip install 'warmfleet[gpu]')",
        )
    return np


def on_mlx(xp: ModuleType) -> bool:
    """The array module is MLX's (engine/mlx_backend runs the model)."""
    return xp.__name__.startswith("mlx")


def compute_dtype(name: str) -> np.dtype[Any]:
    if name not in DTYPES:
        raise InvalidRequestError("dtype", f"must be one of {', '.join(DTYPES)}, got {name!r}")
    return np.dtype(DTYPES[name])


def set_threads(num_threads: int | None) -> int:
    """Cap the BLAS thread pool of this process (None: one per core); returns the count.

    Two processes that each spin a thread per core on the same cores slow each other down
    many times over, so a worker sharing the box takes its share only.
    """
    n = num_threads or os.cpu_count() or 1
    if n < 1:
        raise InvalidRequestError("threads", f"must be >= 1, got {n}")
    threadpool_limits(n, user_api="blas")
    kernels.set_num_threads(min(n, kernels.MAX_THREADS))
    blas.POOL.configure(n)
    return n


def threads_for_step(longest_chunk: int) -> None:
    """Before a forward pass whose longest segment has `longest_chunk` tokens: unless a
    chunk goes to BLAS, the Numba kernel does every matmul, so BLAS gets one thread. Its
    idle threads otherwise spin after each attention call and take the cores from the
    kernel (a 17-token step over 2,000 cached positions took 350-460 ms instead of ~107 ms
    here). Where the C kernels call BLAS from their own threads, it keeps one thread
    (engine/ops/blas.py)."""
    blas.POOL.use(1 if longest_chunk <= kernels.SMALL_ROWS else blas.POOL.configured)


def device_name(xp: ModuleType) -> str:
    """What `--device` names the array module: cpu, mlx or cuda."""
    return "cpu" if xp is np else "mlx" if on_mlx(xp) else "cuda"


def to_host(a: Any) -> np.ndarray:
    """A NumPy copy (or view) of an array from either module."""
    return a.get() if hasattr(a, "get") else np.asarray(a)
