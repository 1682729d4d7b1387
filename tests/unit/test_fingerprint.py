"""The model fingerprint, which names the KV a model computes (spill files, prefix blocks):
every tensor's bytes in it, whatever order the threads hashing them finish in, and kept
across loads only while the file stays as it was hashed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from engine.loader import fingerprint as fp
from engine.loader.fingerprint import fingerprint
from engine.model import Model
from engine.text.gguf_file import open_gguf
from engine.text.model_config import ModelConfig


def test_the_same_file_gives_the_same_fingerprint_each_load(tiny_path: Path) -> None:
    config = Model.load(tiny_path, device="cpu").config
    digests = {fingerprint(open_gguf(tiny_path), config) for _ in range(5)}
    assert len(digests) == 1
    assert Model.load(tiny_path, device="cpu").fingerprint in digests


def test_one_byte_of_one_tensor_changes_it(tiny_path: Path, tmp_path: Path) -> None:
    config = Model.load(tiny_path, device="cpu").config
    changed = tmp_path / "changed.gguf"
    shutil.copyfile(tiny_path, changed)
    flip_a_byte_of_the_last_tensor(changed)
    assert fingerprint(open_gguf(changed), config) != fingerprint(open_gguf(tiny_path), config)


def flip_a_byte_of_the_last_tensor(path: Path) -> None:
    before = open_gguf(path).tensors[-1].data.tobytes()
    at = path.read_bytes().index(before) + len(before) // 2  # a byte in its middle
    with path.open("r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 1]))
    assert open_gguf(path).tensors[-1].data.tobytes() != before  # a tensor's byte


@pytest.fixture
def cached_copy(
    tiny_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, ModelConfig, Path]:
    """(the fingerprint cache's folder, the tiny model's config, a copy of its file made
    just now)."""
    config = Model.load(tiny_path, device="cpu").config
    kept = tmp_path / "fingerprints"
    monkeypatch.setenv("WARMFLEET_FINGERPRINT_DIR", str(kept))
    copy = tmp_path / "m.gguf"
    shutil.copyfile(tiny_path, copy)
    return kept, config, copy


def test_a_file_hashed_once_is_read_from_the_cache_until_it_changes(
    cached_copy: tuple[Path, ModelConfig, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    kept, config, copy = cached_copy
    monkeypatch.setattr(fp, "RACY_S", -1.0)  # a file just copied counts as settled
    digest = fp.fingerprint(open_gguf(copy), config, copy)
    assert digest == fp.tensors_digest(open_gguf(copy), config)
    assert [f.read_text() for f in kept.iterdir()] == [digest + "\n"]

    def no_hashing(*_: object) -> str:
        raise AssertionError("hashed again")

    with monkeypatch.context() as m:
        m.setattr(fp, "tensors_digest", no_hashing)
        assert fp.fingerprint(open_gguf(copy), config, copy) == digest
    flip_a_byte_of_the_last_tensor(copy)
    later = copy.stat().st_mtime_ns + 10**9  # a change a second later: same size
    os.utime(copy, ns=(later, later))
    changed = fp.fingerprint(open_gguf(copy), config, copy)
    assert changed != digest and changed == fp.tensors_digest(open_gguf(copy), config)
    assert len(list(kept.iterdir())) == 2


def test_a_file_changed_just_now_is_not_kept(cached_copy: tuple[Path, ModelConfig, Path]) -> None:
    kept, config, copy = cached_copy  # its times now: another change could keep them
    digest = fp.fingerprint(open_gguf(copy), config, copy)
    assert digest == fp.tensors_digest(open_gguf(copy), config)
    assert not kept.exists()
