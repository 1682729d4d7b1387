"""Every CUDA source of the engine (engine/ops/csrc/*.cu) compiles, here, without a GPU:
NVRTC (tests/nvrtc.py), with the options gpu_ops.compiled gives CuPy, for the GPU classes
the GPU check runs on; and every kernel the Python side launches by name is an entry of
the source it names. A GPU session then finds no compile error to spend its time on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.ops import gpu_ops
from tests.nvrtc import ARCHES, compile_source, library

pytestmark = pytest.mark.skipif(
    library() is None, reason="needs the nvidia-cuda-nvrtc-cu12 wheel (Linux; the dev extra)"
)
ENGINE = Path(gpu_ops.__file__).parents[1]
SOURCES = sorted(gpu_ops.CSRC.glob("*.cu"))
LAUNCH = re.compile(r'compiled\(\s*"(\w+\.cu)"\s*\)\s*\.get_function\(\s*"(\w+)"\s*\)')


def launched() -> set[tuple[str, str]]:
    """(source, kernel) of every launch in the engine's Python: by name, or picked from
    gpu_ops' tables by the pool's dtype."""
    found = {("elementwise.cu", name) for name in gpu_ops.ROPE_KERNELS.values()}
    found |= {("attention.cu", name) for name in gpu_ops.ATTENTION_KERNELS.values()}
    for path in ENGINE.rglob("*.py"):
        found |= set(LAUNCH.findall(path.read_text()))
    return found


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_the_source_compiles_and_holds_every_kernel_launched_from_it(
    source: Path, arch: str
) -> None:
    got = compile_source(source.read_text(), source.name, (*gpu_ops.OPTIONS, f"-arch={arch}"))
    assert got.ok, got.log
    entries = set(re.findall(r"\.entry\s+(\w+)", got.ptx))
    wanted = {kernel for src, kernel in launched() if src == source.name}
    assert wanted, f"nothing launches a kernel of {source.name}"
    assert wanted <= entries, f"launched but not defined: {sorted(wanted - entries)}"


def test_a_broken_source_is_refused_with_the_compilers_message() -> None:
    source = 'extern "C" __global__ void f(float* x) { x[0] = y; }'
    got = compile_source(source, "bad.cu", (*gpu_ops.OPTIONS, f"-arch={ARCHES[0]}"))
    assert not got.ok
    assert 'identifier "y" is undefined' in got.log


def test_every_launch_names_a_source_there_is() -> None:
    names = {p.name for p in SOURCES}
    found = launched()
    assert len(found) >= 10
    assert {src for src, _ in found} <= names
