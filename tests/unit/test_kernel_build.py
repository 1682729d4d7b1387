"""The C kernels' compile (engine/ops/native.py `built`), shared by the processes that start
at once and robust to one killed half way, exercised with real processes and the real
compiler on a one-function source (the kernels' own take ~25 s); a wrapper around the
compiler counts its runs and can slow them. And a machine without a compiler says so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CC = os.environ.get("CC") or "cc"
DEADLINE_S = 120.0


def wrapper(tmp: Path, sleep_s: float) -> Path:
    """A compiler that logs each run to tmp/runs and sleeps `sleep_s` before compiling."""
    path = tmp / f"cc-{sleep_s:g}"
    path.write_text(
        f'#!/bin/sh\necho "$*" >> {tmp}/runs\nsleep {sleep_s}\nexec {CC} "$@"\n', encoding="utf-8"
    )
    path.chmod(0o755)
    return path


def build(tmp: Path, cc: Path) -> subprocess.Popen[str]:
    """A process that builds tmp/kernels/answer.so from answer.c and calls it."""
    source = tmp / "answer.c"
    source.write_text("int answer(void) { return 42; }\n", encoding="utf-8")
    script = textwrap.dedent(f"""
        import ctypes, logging, pathlib
        logging.basicConfig(level=logging.INFO)
        from engine.ops import native
        native.PROGRESS_S = 0.5
        target = pathlib.Path({str(tmp / "kernels" / "answer.so")!r})
        src = (pathlib.Path({str(source)!r}),)
        path = native.built({str(cc)!r}, target, src, ("-O1", "-shared", "-fPIC"))
        print("answer", ctypes.CDLL(str(path)).answer())
    """)
    argv, out = [sys.executable, "-c", script], subprocess.PIPE
    return subprocess.Popen(
        argv, cwd=REPO, text=True, start_new_session=True, stdout=out, stderr=out
    )


def compiles(tmp: Path) -> int:
    runs = tmp / "runs"
    return sum(" -c " in line for line in runs.read_text().splitlines()) if runs.exists() else 0


def test_processes_starting_at_once_compile_once_and_share_it(tmp_path: Path) -> None:
    cc = wrapper(tmp_path, 2.0)
    procs = [build(tmp_path, cc) for _ in range(2)]
    outs = [p.communicate(timeout=DEADLINE_S) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all("answer 42" in out for out, _ in outs)
    assert compiles(tmp_path) == 1  # one compiled, the other waited for it
    assert sorted(p.name for p in (tmp_path / "kernels").iterdir()) == [
        "answer.lock",
        "answer.so",
    ]


def test_a_killed_compile_leaves_a_cache_the_next_process_builds(tmp_path: Path) -> None:
    slow = build(tmp_path, wrapper(tmp_path, 60.0))
    deadline = time.monotonic() + DEADLINE_S
    while compiles(tmp_path) == 0:  # compiling now
        assert time.monotonic() < deadline and slow.poll() is None
        time.sleep(0.05)
    os.killpg(slow.pid, signal.SIGKILL)  # the process and its compiler
    slow.wait(timeout=DEADLINE_S)
    kernels = tmp_path / "kernels"
    assert list(kernels.glob("answer.build-*")) and not (kernels / "answer.so").exists()
    fast = build(tmp_path, wrapper(tmp_path, 0.0))
    out, err = fast.communicate(timeout=DEADLINE_S)
    assert fast.returncode == 0 and "answer 42" in out, err
    assert sorted(p.name for p in kernels.iterdir()) == ["answer.lock", "answer.so"]


def test_a_machine_without_a_compiler_says_so_once(tmp_path: Path) -> None:
    script = (
        "import logging; logging.basicConfig(level=logging.INFO)\n"
        "from engine.ops import native\n"
        "assert native.library() is None and native.library() is None\n"
    )
    env = {**os.environ, "PATH": str(tmp_path), "WARMFLEET_KERNEL_DIR": str(tmp_path)}
    env.pop("CC", None)
    argv = [sys.executable, "-c", script]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("no C compiler found") == 1
    assert "Numba kernels" in done.stderr


def test_a_compiler_without_openmp_builds_kernels_all_the_same(tmp_path: Path) -> None:
    """As Apple's clang refuses -fopenmp: the kernels are built without it, not given up
    (their threads then par.c's own; tests/unit/test_neon_build.py runs them). Only what the
    compiler said may tell why it failed: the path of this test's folder holds "omp"."""
    clang = tmp_path / "clang-like"
    clang.write_text(
        '#!/bin/sh\nfor a in "$@"; do [ "$a" = -fopenmp ] && '
        "{ echo \"clang: error: unsupported option '-fopenmp'\" >&2; exit 1; }; done\n"
        f'exec {CC} "$@"\n',
        encoding="utf-8",
    )
    clang.chmod(0o755)
    source = tmp_path / "answer.c"
    source.write_text("int answer(void) { return 42; }\n", encoding="utf-8")
    script = (
        "import logging, pathlib; logging.basicConfig(level=logging.INFO)\n"
        "from engine.ops import native\n"
        f"native.SOURCES, native.HEADERS = (pathlib.Path({str(source)!r}),), ()\n"
        "print('answer', native.library().answer())\n"
    )
    env = {**os.environ, "CC": str(clang), "WARMFLEET_KERNEL_DIR": str(tmp_path / "kernels")}
    argv = [sys.executable, "-c", script]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "answer 42" in done.stdout, done.stderr
    assert "has no OpenMP" in done.stderr and "unsupported option '-fopenmp'" in done.stderr
    assert len(list((tmp_path / "kernels").glob("*.so"))) == 1
