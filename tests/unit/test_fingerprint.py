"""The model fingerprint, which names the KV a model computes (spill files, prefix blocks):
every tensor's bytes in it, whatever order the threads hashing them finish in."""

from __future__ import annotations

import shutil
from pathlib import Path

from engine.loader.fingerprint import fingerprint
from engine.model import Model
from engine.text.gguf_file import open_gguf


def test_the_same_file_gives_the_same_fingerprint_each_load(tiny_path: Path) -> None:
    config = Model.load(tiny_path, device="cpu").config
    digests = {fingerprint(open_gguf(tiny_path), config) for _ in range(5)}
    assert len(digests) == 1
    assert Model.load(tiny_path, device="cpu").fingerprint in digests


def test_one_byte_of_one_tensor_changes_it(tiny_path: Path, tmp_path: Path) -> None:
    config = Model.load(tiny_path, device="cpu").config
    changed = tmp_path / "changed.gguf"
    shutil.copyfile(tiny_path, changed)
    before = open_gguf(changed).tensors[-1].data.tobytes()
    at = changed.read_bytes().index(before) + len(before) // 2  # a byte in its middle
    with changed.open("r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 1]))
    assert open_gguf(changed).tensors[-1].data.tobytes() != before  # a tensor's byte
    assert fingerprint(open_gguf(changed), config) != fingerprint(open_gguf(tiny_path), config)
