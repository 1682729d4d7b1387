"""A CUDA C++ source built for the CPU (runtime.h): its inline PTX replaced by the same
arithmetic in C++, each kernel given a launcher that takes the grid and block and the
addresses of its arguments (as cuLaunchKernel takes them), compiled by the C++ compiler
into a library cached beside the engine's C kernels.

The build checks what the CPU can of what a GPU would fault on: loads of uint2, uint4 and
float4 at addresses not aligned to them, and indexes past a fixed-size array (shared
arrays included), each a trap (the test's process dies with SIGILL and its traceback)."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.ops import native

RUNTIME = Path(__file__).with_name("runtime.h")
FLAGS = (
    "-std=c++17",
    "-O2",
    "-fPIC",
    "-shared",
    "-fvisibility=hidden",
    "-ffp-contract=off",
    "-fno-strict-aliasing",
    "-U_FORTIFY_SOURCE",
    "-Wno-unknown-pragmas",
    "-fsanitize=alignment,bounds",
    "-fsanitize-undefined-trap-on-error",
)
PTX = (  # the inline PTX the sources use, and its C++
    (
        r'asm\("cvt\.f32\.f16 %0, %1;"\s*:\s*"=f"\((\w+)\)\s*:\s*"h"\((\w+)\)\);',
        r"\1 = wf_emu::half_to_float(\2);",
    ),
    (
        r'asm\("cvt\.rn\.f16\.f32 %0, %1;"\s*:\s*"=h"\((\w+)\)\s*:\s*"f"\((\w+)\)\);',
        r"\1 = wf_emu::float_to_half(\2);",
    ),
)
SCALARS = {  # a kernel's scalar parameter types, as NumPy dtypes
    "int": np.int32,
    "unsigned int": np.uint32,
    "unsigned": np.uint32,
    "long long": np.int64,
    "unsigned long long": np.uint64,
    "float": np.float32,
    "double": np.float64,
    "bool": np.bool_,
    "char": np.int8,
    "unsigned char": np.uint8,
    "short": np.int16,
    "unsigned short": np.uint16,
}
KERNEL = re.compile(r'extern\s+"C"\s+void\s+(\w+)\s*\(([^)]*)\)')


@dataclass(frozen=True, slots=True)
class Param:
    text: str  # the C++ type, without __restrict__
    pointer: bool
    dtype: np.dtype | None  # a scalar's; a pointer's element (None: void, any array)


@dataclass(frozen=True, slots=True)
class Kernel:
    name: str
    params: tuple[Param, ...]


def without_ptx(source: str) -> str:
    for pattern, cxx in PTX:
        source = re.sub(pattern, cxx, source)
    left = [line.strip() for line in source.splitlines() if re.search(r"\basm\s*\(", line)]
    if left:
        raise ValueError(f"inline PTX the CPU build does not know: {left[0]}")
    return source


def param(text: str) -> Param:
    words = re.sub(r"__restrict__|__restrict", " ", text).replace("*", " * ").split()
    ctype = " ".join(words[:-1])  # the last word is the parameter's name
    pointer = "*" in words
    base = " ".join(w for w in words[:-1] if w not in ("const", "*"))
    if base == "void" and pointer:
        return Param(ctype, True, None)
    if base not in SCALARS:
        raise ValueError(f"a kernel parameter of a type the CPU build does not know: {text!r}")
    return Param(ctype, pointer, np.dtype(SCALARS[base]))


def kernels(source: str, cxx: str) -> tuple[Kernel, ...]:
    """The extern "C" kernels of a source, their parameters read after its macros expand."""
    done = subprocess.run(
        [cxx, "-E", "-P", "-x", "c++", "-D__global__=", "-"],
        input=source,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found = KERNEL.findall(done.stdout)
    return tuple(Kernel(n, tuple(param(p) for p in ps.split(",") if p.strip())) for n, ps in found)


def launchers(found: tuple[Kernel, ...]) -> str:
    out = [
        'extern "C" __attribute__((visibility("default"))) const char* wf_emu_error() {',
        "    return wf_emu::error.c_str();",
        "}",
    ]
    for k in found:
        args = ", ".join(f"*reinterpret_cast<{p.text}*>(args[{i}])" for i, p in enumerate(k.params))
        out += [
            f'extern "C" __attribute__((visibility("default"))) int wf_emu_{k.name}('
            "const unsigned* dims, void** args) {",
            f"    return wf_emu::launch(dims, [args] {{ {k.name}({args}); }});",
            "}",
        ]
    return "\n".join(out) + "\n"


def compiler() -> str:
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        raise RuntimeError("no C++ compiler (c++): ./dev installs g++ (apt-get install g++)")
    return cxx


@functools.cache
def library(source: str, name: str) -> tuple[ctypes.CDLL, dict[str, Kernel]]:
    """The CPU build of a CUDA source (compiled once a machine), and its kernels by name."""
    cxx = compiler()
    code = without_ptx(source)
    found = kernels(code, cxx)
    text = f'#include "{RUNTIME}"\n#line 1 "{name}"\n{code}\n{launchers(found)}'
    key = hashlib.blake2b(digest_size=10)
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    for part in (text, RUNTIME.read_text(), " ".join(FLAGS), cxx, version.stdout):
        key.update(part.encode())
    folder = native.kernel_dir() / "cuda-emu"
    cpp = folder / f"{Path(name).stem}-{key.hexdigest()}.cpp"
    folder.mkdir(parents=True, exist_ok=True)
    if not cpp.exists():  # written whole, then renamed: another process reads all or none
        partial = cpp.with_suffix(f".{os.getpid()}.part")
        partial.write_text(text)
        os.replace(partial, cpp)
    lib = ctypes.CDLL(str(native.built(cxx, cpp.with_suffix(".so"), (cpp,), FLAGS)))
    lib.wf_emu_error.restype = ctypes.c_char_p
    return lib, {k.name: k for k in found}
