"""deploy/Dockerfile's install steps, run the way the image build runs them (no builder
here): the cpu-build stage's COPY lines copy the same sources into a fresh folder, and its RUN
lines run there with the same commands and extras, into a fresh virtual environment; then
the installed `warmfleet` must start, and carry the files it needs at run time."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dockerfile import stages

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
STAGE = "cpu-build"
INSTALL_TIMEOUT_S = 1200
JUNK = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")


def copy_context(into: Path) -> Path:
    """The stage's COPY lines replayed: sources from the repository root (the build
    context), destinations under its WORKDIR, here `into`."""
    stage = stages()[STAGE]
    for sources, dest, from_stage in stage.copies():
        assert from_stage is None, "the build stage copies from the context only"
        for source in sources:
            src, target = REPO / source, into / dest
            if src.is_dir():  # COPY copies a folder's contents into the destination
                shutil.copytree(src, target, ignore=JUNK, dirs_exist_ok=True)
            else:
                assert dest.endswith("/"), f"COPY {source} {dest}: a folder, ending in /"
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target / src.name)
    return into


def test_the_cpu_image_s_install_steps_give_a_working_warmfleet(tmp_path: Path) -> None:
    stage = stages()[STAGE]
    source = copy_context(tmp_path / "src")
    venv = tmp_path / "venv"
    env = {**os.environ, **stage.env(), "VIRTUAL_ENV": str(venv)}
    # `python` as in the image: an interpreter with no warmfleet installed (venv makes its own)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    runs = stage.runs()
    assert any("pip" in run and "install" in run for run in runs), runs
    for run in runs:
        done = subprocess.run(["sh", "-c", run], cwd=source, env=env, capture_output=True,
                              text=True, timeout=INSTALL_TIMEOUT_S)  # fmt: skip
        assert done.returncode == 0, f"RUN {run}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    outside = tmp_path / "elsewhere"  # not the sources: what runs must come from the venv
    outside.mkdir()
    shutil.rmtree(source)

    def installed(*argv: str) -> str:
        done = subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], cwd=outside,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, f"{argv}: {done.stderr[-2000:]}"
        return done.stdout

    assert installed("warmfleet", "--version").startswith("warmfleet ")
    assert "{grpc,worker}" in installed("warmfleet", "health", "--help")
    packaged = installed(
        "python", "-c", "import engine.ops.native as n, gateway, pathlib; "
        "print(len(n.SOURCES), (pathlib.Path(gateway.__file__).parent / 'static').is_dir())",
    )  # fmt: skip
    sources = list((REPO / "engine" / "ops" / "csrc").glob("*.c"))
    assert packaged.split() == [str(len(sources)), "True"]
