"""engine/text/gguf_file.py's own header parser against gguf-py's GGUFReader: the same values of
the same Python types, the same tensors viewing the same bytes; and malformed headers
refused by name."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from common.errors import NotGGUFError
from engine.text.gguf_file import open_gguf, read_metadata
from tests.tiny_gguf import write_tiny_llama


def assert_same_as_gguf_py(path: Path) -> None:
    ours, theirs = open_gguf(path), gguf.GGUFReader(path)
    expected = {name: field.contents() for name, field in theirs.fields.items()}
    got = read_metadata(ours)
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert got[key] == value and type(got[key]) is type(value), key
        if isinstance(value, list) and value:
            assert {type(v) for v in got[key]} == {type(v) for v in value}, key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert a.tensor_type == b.tensor_type and a.shape.tolist() == b.shape.tolist(), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data, b.data), a.name


def test_the_default_model_reads_as_gguf_py_reads_it(default_model_path: Path) -> None:
    assert_same_as_gguf_py(default_model_path)  # Q4_1 and Q8_0 matrices, F32 norms


@pytest.mark.parametrize(
    "matrix_type",
    [gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0],
)
def test_tiny_files_read_as_gguf_py_reads_them(
    tmp_path: Path, matrix_type: gguf.GGMLQuantizationType
) -> None:
    extras: dict[str, str | float | np.ndarray] = {"general.name": "tiny ü", "x.f": 0.5}
    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=matrix_type, extras=extras)
    assert_same_as_gguf_py(path)


def header(*parts: bytes) -> bytes:
    return b"GGUF" + b"".join(parts)


def string(s: str) -> bytes:
    return struct.pack("<Q", len(s.encode())) + s.encode()


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (header(struct.pack("<I", 1)), ["version 1"]),  # GGUF's first version
        (header(struct.pack(">I", 3)), ["version 50331648", "little-endian"]),  # big-endian
        (header(struct.pack("<IQQ", 3, 0, 1), string("k"), struct.pack("<I", 99)), ["type 99"]),
        (header(struct.pack("<IQQ", 3, 0, 1), struct.pack("<Q", 1 << 40)), ["truncated"]),
        (header(struct.pack("<IQQ", 3, 1, 0), string("t"), struct.pack("<I", 1)), ["truncated"]),
    ],
    ids=["version-1", "big-endian", "unknown-type", "string-past-end", "tensor-cut"],
)
def test_malformed_headers_are_refused_by_name(
    tmp_path: Path, data: bytes, words: list[str]
) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(NotGGUFError) as err:
        open_gguf(path)
    assert "bad.gguf: malformed GGUF file" in str(err.value)
    for word in words:
        assert word in str(err.value)
