"""What bench/gpu_pack.py packs for the GPU check: the model's pieces join into the file they
came from, under the sha256 the check verifies; the redis-server it carries runs from its
own folder on the libraries beside it; bench/gpu_check.sh parses."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from bench import gpu_pack

REPO = Path(__file__).resolve().parents[2]


def test_the_pieces_join_into_the_model_under_its_sha256(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_pack, "PIECE_MIB", 1)
    model = tmp_path / "model.gguf"
    model.write_bytes(bytes(range(256)) * 9000)  # 2.2 MiB: two full pieces and a short one
    folders = [tmp_path / name for name in gpu_pack.FOLDERS]
    for folder in folders:
        folder.mkdir()
    sha = gpu_pack.pieces(model, folders)
    parts = [folder / f"model.part{n}" for n, folder in enumerate(folders)]
    assert [p.stat().st_size for p in parts] == [1 << 20, 1 << 20, 2_304_000 - (2 << 20)]
    joined = b"".join(p.read_bytes() for p in parts)
    assert joined == model.read_bytes() and hashlib.sha256(joined).hexdigest() == sha


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_the_carried_redis_server_runs_from_its_folder(tmp_path: Path) -> None:
    gpu_pack.redis_bundle(tmp_path / "redis")
    moved = tmp_path / "elsewhere"
    shutil.move(tmp_path / "redis", moved)  # as it lands in another checkout
    done = subprocess.run(
        [str(moved / "redis-server"), "--version"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0 and done.stdout.startswith("Redis server v="), done.stderr
    # every library the binary links beyond the C runtime is carried beside it
    linked = subprocess.run(
        ["ldd", str(moved / "redis-server.bin")], capture_output=True, text=True
    )
    names = {line.split("=>")[0].strip() for line in linked.stdout.splitlines() if "=>" in line}
    needed = {n for n in names if not any(s in n for s in gpu_pack.SYSTEM_LIBS)}
    assert needed and needed <= {p.name for p in (moved / "lib").iterdir()}


def test_the_check_script_parses() -> None:
    script = REPO / "bench" / "gpu_check.sh"
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
