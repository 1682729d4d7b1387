"""CUDA C++ compiled on a machine without a GPU: NVIDIA's runtime compiler (NVRTC, the one
CuPy's RawModule calls) from the `nvidia-cuda-nvrtc-cu12` wheel, through ctypes. It turns
a source into PTX, which is what CuPy loads; nothing is run."""

from __future__ import annotations

import ctypes
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

# the -arch CuPy adds for a device of that class: Ampere, Hopper (the H100/H200 the GPU
# check runs on) and the GB10's Blackwell (sm_121: NVRTC 12.9 on)
ARCHES = ("compute_80", "compute_90", "compute_121")


@dataclass(frozen=True, slots=True)
class Compiled:
    ok: bool
    log: str
    ptx: str


@functools.cache
def library() -> ctypes.CDLL | None:
    """libnvrtc from the wheel, or None where it is not installed (macOS, Windows)."""
    spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder, "lib").glob("libnvrtc.so.*"))
        if found:
            lib = ctypes.CDLL(str(found[0]))
            lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            return lib
    return None


def compile_source(source: str, name: str, options: tuple[str, ...]) -> Compiled:
    """`source` compiled with `options` (as CuPy's RawModule passes them)."""
    lib = library()
    assert lib is not None, "no NVRTC here"
    prog = ctypes.c_void_p()
    created = lib.nvrtcCreateProgram(
        ctypes.byref(prog), source.encode(), name.encode(), 0, None, None
    )
    _check(lib, created)
    try:
        args = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        ok = lib.nvrtcCompileProgram(prog, len(options), args) == 0
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)))
        log = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetProgramLog(prog, log))
        ptx = b""
        if ok:
            _check(lib, lib.nvrtcGetPTXSize(prog, ctypes.byref(size)))
            buf = ctypes.create_string_buffer(size.value)
            _check(lib, lib.nvrtcGetPTX(prog, buf))
            ptx = buf.value
        return Compiled(ok, log.value.decode(errors="replace"), ptx.decode(errors="replace"))
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _check(lib: ctypes.CDLL, result: int) -> None:
    if result != 0:
        raise RuntimeError(f"NVRTC: {lib.nvrtcGetErrorString(result).decode()}")
