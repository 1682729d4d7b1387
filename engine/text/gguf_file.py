"""Open a GGUF file and read its header, turning every failure into a named error.

The header is parsed here rather than by gguf-py's GGUFReader, which builds a NumPy view
per value: 2 s for the default model's 98k vocabulary strings and 9 s for Llama 3's 408k,
paid by every process that loads a model. Strings here are sliced from one bytes object of
the header; arrays of numbers are one `np.frombuffer` each. Tensor data stays in the file's
memory map, viewed as gguf-py views it (the types `gguf.quants` decodes).

The layout (little-endian): magic `GGUF`, version (2 or 3), tensor count and key count
(uint64); each key a string (uint64 length, UTF-8 bytes), a value type (uint32) and its
value, an array being an element type, a uint64 count and the elements; each tensor a name,
a dimension count (uint32), the dimensions (uint64, fastest first), a type (uint32) and an
offset (uint64) from the data section, which starts at the next multiple of
`general.alignment` (32 unless set) after the tensor list.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from common.errors import ModelNotFoundError, NotGGUFError

GGUF_MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# value type -> (struct format, NumPy dtype) of the fixed-size ones; 7 is bool, 8 string, 9 array
_SCALARS = {0: ("<B", "<u1"), 1: ("<b", "<i1"), 2: ("<H", "<u2"), 3: ("<h", "<i2"),
            4: ("<I", "<u4"), 5: ("<i", "<i4"), 6: ("<f", "<f4"), 7: ("<?", "<u1"),
            10: ("<Q", "<u8"), 11: ("<q", "<i8"), 12: ("<d", "<f8")}  # fmt: skip
_BOOL, _STRING, _ARRAY = 7, 8, 9
_PLAIN_TENSORS = {gguf.GGMLQuantizationType.F32: np.float32,
                  gguf.GGMLQuantizationType.F16: np.float16,
                  gguf.GGMLQuantizationType.F64: np.float64,
                  gguf.GGMLQuantizationType.I8: np.int8, gguf.GGMLQuantizationType.I16: np.int16,
                  gguf.GGMLQuantizationType.I32: np.int32,
                  gguf.GGMLQuantizationType.I64: np.int64}  # fmt: skip


class _Truncated(Exception):
    """A read past the end of the file."""


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    """One tensor of the file: its data a view of the file's memory map."""

    name: str
    tensor_type: gguf.GGMLQuantizationType
    shape: np.ndarray  # dimensions as GGUF lists them, fastest first
    data: np.ndarray  # [rows..., row] in its NumPy type, or uint8 [rows..., bytes] if quantized


@dataclass(frozen=True, slots=True)
class GGUFFile:
    """A GGUF file's header values and tensors; the tensors' bytes stay on disk until read."""

    metadata: dict[str, Any]
    tensors: list[GGUFTensor]


class _Cursor:
    """Reads values one after another from the header's bytes."""

    def __init__(self, buf: bytes | memoryview, offset: int = 0) -> None:
        self.buf, self.at = buf, offset

    def take(self, n: int) -> int:
        """Advance over `n` bytes; the offset they start at."""
        start, self.at = self.at, self.at + n
        if self.at > len(self.buf):
            raise _Truncated
        return start

    def scalar(self, fmt: str) -> Any:
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        start = self.take(n)
        return bytes(self.buf[start : start + n]).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            return self.array()
        if kind not in _SCALARS:
            raise ValueError(f"unknown value type {kind}")
        v = self.scalar(_SCALARS[kind][0])
        return bool(v) if kind == _BOOL else v

    def array(self) -> list[Any]:
        kind, count = self.scalar("<I"), self.scalar("<Q")
        if kind in _SCALARS:
            dtype = np.dtype(_SCALARS[kind][1])
            start = self.take(count * dtype.itemsize)
            values = np.frombuffer(self.buf, dtype, count, start)
            return values.astype(bool).tolist() if kind == _BOOL else values.tolist()
        if kind == _STRING:
            return [self.string() for _ in range(count)]
        return [self.value(kind) for _ in range(count)]


def release_pages(data: np.ndarray) -> None:
    """Drop the whole pages of `data`, a view of a file's map, from this process's resident
    memory (they stay in the page cache; a later read faults them back in): for a tensor
    copied out at load while the map stays open, so that its bytes count once. A no-op where
    the platform has no madvise."""
    mapping = getattr(data, "_mmap", None)
    if mapping is None or not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = data.ctypes.data - _whole_map(data).ctypes.data
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (start + data.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > first:
        mapping.madvise(mmap.MADV_DONTNEED, first, end - first)


def release_header(reader: GGUFFile) -> None:
    """release_pages of the header (its values are parsed into Python objects)."""
    if reader.tensors:
        whole = _whole_map(reader.tensors[0].data)
        first = min(int(t.data.ctypes.data) for t in reader.tensors) - whole.ctypes.data
        release_pages(whole[:first])


def _whole_map(data: np.ndarray) -> np.ndarray:
    """The map of the whole file a view of it was taken from."""
    while isinstance(data.base, np.ndarray):
        data = data.base
    return data


def open_gguf(path: str | Path) -> GGUFFile:
    """The file's header and tensors; raises ModelNotFoundError or NotGGUFError."""
    path = Path(path)
    if not path.is_file():
        raise ModelNotFoundError(f"model file not found: {path}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise NotGGUFError(f"{path} is not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        mapped = np.memmap(path, dtype=np.uint8, mode="r")
        return _parse(mapped)
    except _Truncated as e:
        raise NotGGUFError(f"{path}: malformed GGUF file (truncated)") from e
    except (ValueError, struct.error, UnicodeDecodeError, OverflowError) as e:
        raise NotGGUFError(f"{path}: malformed GGUF file ({type(e).__name__}: {e})") from e


def _parse(mapped: np.ndarray) -> GGUFFile:
    cur = _Cursor(mapped.data, len(GGUF_MAGIC))
    version = cur.scalar("<I")
    if version not in VERSIONS:
        raise ValueError(f"version {version} (this reader knows {VERSIONS}, little-endian)")
    tensor_count, key_count = cur.scalar("<Q"), cur.scalar("<Q")
    # the header's own counts first, as gguf-py's reader lists them
    metadata: dict[str, Any] = {
        "GGUF.version": version,
        "GGUF.tensor_count": tensor_count,
        "GGUF.kv_count": key_count,
    }
    for _ in range(key_count):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar("<I"))
    infos = [_tensor_info(cur) for _ in range(tensor_count)]
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    if alignment <= 0:
        raise ValueError(f"general.alignment {alignment}")
    data_start = -(-cur.at // alignment) * alignment
    tensors, names = [], set()
    for name, dims, kind, offset in infos:
        if name in names:
            raise ValueError(f"tensor {name} appears twice")
        names.add(name)
        tensors.append(_tensor(mapped, name, dims, kind, data_start + offset))
    return GGUFFile(metadata, tensors)


def _tensor_info(cur: _Cursor) -> tuple[str, np.ndarray, int, int]:
    name = cur.string()
    n_dims = cur.scalar("<I")
    dims = np.array([cur.scalar("<Q") for _ in range(n_dims)], dtype=np.uint64)
    return name, dims, cur.scalar("<I"), cur.scalar("<Q")


def _tensor(mapped: np.ndarray, name: str, dims: np.ndarray, kind: int, at: int) -> GGUFTensor:
    tensor_type = gguf.GGMLQuantizationType(kind)
    n = int(np.prod(dims))
    block, block_bytes = gguf.GGML_QUANT_SIZES[tensor_type]
    n_bytes = n * block_bytes // block
    if at + n_bytes > mapped.size:
        raise _Truncated
    shape = tuple(reversed(dims.tolist()))
    raw, plain = mapped[at : at + n_bytes], _PLAIN_TENSORS.get(tensor_type)
    if plain is None:  # bytes, rows of whole blocks
        data = raw.reshape(gguf.quants.quant_shape_to_byte_shape(shape, tensor_type))
    else:
        data = raw.view(plain).reshape(shape)
    return GGUFTensor(name, tensor_type, dims, data)


def read_metadata(reader: GGUFFile) -> dict[str, Any]:
    """Every key/value of the header as plain Python values (str, int, float, bool, list)."""
    return dict(reader.metadata)
