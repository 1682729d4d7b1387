"""Packs what the GPU check (bench/gpu_check.sh) needs on a GPU machine that can fetch
nothing and takes at most 64 MiB a call, the working tree (~10 MiB) included:

    .venv/bin/python -m bench.gpu_pack          # writes .gpu/a, .gpu/b, .gpu/c (ignored)

The default model (94 MiB) goes in three pieces of at most PIECE_MIB, one a call, with
redis-server and the shared libraries it needs beside the second piece and the Python
packages the machine's image lacks (wheels for its Python 3.12, at this venv's versions)
beside the third. The
machine keeps what a call carried while it stays warm (30 s after a call), so the three
calls go back to back; the last one runs the check, which joins the pieces and checks the
model's sha256 first:

    carry .gpu/a   command: nvidia-smi -L
    carry .gpu/b   command: true
    carry .gpu/c   command: bench/gpu_check.sh          (timeout_s 540)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

from warmfleet.models import pull_default_model

PIECE_MIB = 32
FOLDERS = ("a", "b", "c")
CALL_LIMIT_MIB = 64
# what warmfleet imports that the GPU machine's image (Python 3.12) lacks or holds older
WHEELS = (
    "gguf",
    "redis",
    "hiredis",
    "starlette",
    "uvicorn",
    "httptools",
    "grpcio",
    "protobuf",
    "grpcio-health-checking",
    "grpcio-reflection",
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
SYSTEM_LIBS = ("libc.so", "libm.so", "ld-linux", "linux-vdso", "libstdc++", "libgcc_s")


def log(text: str) -> None:
    print(f"gpu_pack: {text}", file=sys.stderr, flush=True)


def wheels(into: Path) -> None:
    """Each of WHEELS at this venv's version, built for CPython 3.12 on x86-64 Linux."""
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in WHEELS]
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    argv += ["--python-version", "3.12", "--implementation", "cp", "-d", str(into)]
    for platform in PLATFORMS:
        argv += ["--platform", platform]
    log(f"downloading {len(pins)} wheels")
    subprocess.run([*argv, *pins], check=True, timeout=600, capture_output=True)


def redis_bundle(into: Path) -> None:
    """redis-server and the shared libraries it links that a base image may lack, with a
    wrapper that runs it on them (only it: Python keeps its own)."""
    real = Path(shutil.which("redis-server") or "/usr/bin/redis-server").resolve()
    libs = into / "lib"
    libs.mkdir(parents=True)
    shutil.copy2(real, into / "redis-server.bin")
    listed = subprocess.run(["ldd", str(real)], capture_output=True, text=True, check=True)
    for line in listed.stdout.splitlines():
        parts = line.split("=>")
        if len(parts) == 2 and parts[1].split() and not any(s in line for s in SYSTEM_LIBS):
            shutil.copy2(Path(parts[1].split()[0]).resolve(), libs / parts[0].strip())
    wrapper = into / "redis-server"
    wrapper.write_text(
        '#!/bin/sh\nd="$(dirname "$(readlink -f "$0")")"\n'
        'LD_LIBRARY_PATH="$d/lib" exec "$d/redis-server.bin" "$@"\n'
    )
    wrapper.chmod(0o755)


def pieces(model: Path, folders: list[Path]) -> str:
    """The model in len(folders) pieces, one a folder; returns its sha256."""
    digest = hashlib.sha256()
    size = PIECE_MIB << 20
    with model.open("rb") as f:
        for n, folder in enumerate(folders):
            data = f.read(size) if n < len(folders) - 1 else f.read()
            digest.update(data)
            (folder / f"model.part{n}").write_bytes(data)
    return digest.hexdigest()


def mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / (1 << 20)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path(".gpu"))
    args = p.parse_args(argv)
    model = pull_default_model()
    shutil.rmtree(args.out, ignore_errors=True)
    folders = [args.out / name for name in FOLDERS]
    for folder in folders:
        folder.mkdir(parents=True)
    sha = pieces(model, folders)
    (folders[-1] / "model.txt").write_text(f"{model.name} {sha} {len(folders)}\n")
    redis_bundle(folders[1] / "redis")
    wheels(folders[2] / "wheels")
    tree = subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True).stdout
    tree_mib = sum(Path(f).stat().st_size for f in tree.decode().split("\0") if f) / (1 << 20)
    for folder in folders:
        total = tree_mib + mib(folder)
        log(f"{folder}: {mib(folder):.1f} MiB, {total:.1f} with the tree")
        if total > CALL_LIMIT_MIB:
            raise SystemExit(f"gpu_pack: {folder} and the tree are over {CALL_LIMIT_MIB} MiB")
    log("carry .gpu/a, then .gpu/b, then .gpu/c running bench/gpu_check.sh (module docstring)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
