"""The engine's step tests with the kernels built for AVX2 (WARMFLEET_MARCH=haswell) on a CPU
with AVX-512, as a machine without AVX-512 runs them: there long chunks go to BLAS op by op
for a dense model and stay in the kernels for an MoE model, and the all-layers call, batch
invariance and the families' logits against llama.cpp must hold all the same. (Run natively
on such a machine the suite itself covers this, so the test runs only where the native build
has AVX-512.) tests/unit/test_avx2_build.py compares the kernels' bits one by one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.ops import native

ROOT = Path(__file__).resolve().parent.parent
CHECKS = (
    "tests/unit/test_families_native.py",
    "tests/unit/test_native_layers.py",
    "tests/unit/test_moe_steps.py",
    "tests/unit/test_kv_float16.py",
    "tests/unit/test_families_tiny.py",
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        native.library() is None
        or not native.wide_vectors()
        or not {"avx2", "fma", "f16c"} <= set(native._cpu_flags().split()),
        reason="needs the C kernels built natively for AVX-512 on a CPU that runs AVX2 code",
    ),
]


def test_step_tests_pass_with_the_kernels_built_for_avx2(tmp_path: Path) -> None:
    env = {**os.environ, "WARMFLEET_MARCH": "haswell", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider"]
    # MLX's kernels and the CUDA stand-in's (tests/cuda_emu, -O2 for no -march) do not change
    # with the build
    argv += ["-k", "not mlx and not cuda"]
    done = subprocess.run(
        [*argv, "--basetemp", str(tmp_path / "run"), *CHECKS],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, tail
    assert " passed" in tail and " failed" not in tail, tail
