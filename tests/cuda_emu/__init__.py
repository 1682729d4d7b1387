"""CUDA for the GPU tests on any machine: CuPy where it finds a GPU, else a stand-in that
runs the engine's CUDA sources on the CPU (cupy_module.py, build.py, runtime.h) and
records graph captures (graphs.py), so the CUDA paths' arithmetic, indexing, launches and
captures are checked in CI. What the stand-in cannot tell: speed, the GPU's own rounding of
expf and the like, races between threads (a block's threads take turns), memory read past
an array's end, and whether CuPy's own operations capture."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from engine.device import cupy_with_gpu
from tests.cuda_emu import graphs


@functools.cache
def cupy() -> ModuleType:
    """CuPy with a GPU, else the CPU stand-in."""
    found = cupy_with_gpu()
    if found is not None:
        return found
    from tests.cuda_emu import cupy_module

    return cupy_module.module()


def emulated() -> bool:
    return bool(getattr(cupy(), "emulated", False))


@contextlib.contextmanager
def installed() -> Iterator[ModuleType]:
    """cupy() as the module `import cupy` finds (the engine imports it where it runs)."""
    cp = cupy()
    before = sys.modules.get("cupy")
    sys.modules["cupy"] = cp
    try:
        yield cp
    finally:
        graphs.abandon_capture()  # one a failed test left
        if before is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = before


def for_device(device: str) -> contextlib.AbstractContextManager[object]:
    """installed() for device "cuda", nothing for another."""
    return installed() if device == "cuda" else contextlib.nullcontext()


def process_env() -> dict[str, str]:
    """The environment a process a test starts needs to find cupy(): nothing with a GPU,
    else the stand-in's package first on its PYTHONPATH (and this checkout after it)."""
    if not emulated():
        return {}
    root = Path(__file__).parents[2]
    paths = [str(Path(__file__).with_name("site")), str(root), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}
