"""The frame both kinds of KV file share (spill files, block files): 4 magic bytes, a
little-endian u32 format version, a u32 header length, a JSON header, then the payload:
keys then values, each a C-ordered array of the header's dtype and shape, checksummed with
xxh3-64. Written to a temporary name, fsynced and renamed into place; read back with every
field checked."""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from common.errors import SpillFileError
from engine.kv_files.kv_dtypes import kv_str

PREFIX = struct.Struct("<4sII")
_buffers = threading.local()  # each thread's buffer for read_file


def read_file(path: Path) -> memoryview:
    """The file's bytes, read into this thread's own buffer: valid until the thread's next
    read_file. Many small files (a session's blocks) then take no fresh memory each, whose
    page faults cost more than the copy. Raises FileNotFoundError and other OSErrors."""
    with path.open("rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        buf: bytearray | None = getattr(_buffers, "buf", None)
        if buf is None or len(buf) < size:
            buf = _buffers.buf = bytearray(size)
        view, got = memoryview(buf), 0
        while got < size:
            n = f.readinto(view[got:size])
            if not n:  # shorter than its size said: checks will refuse it
                break
            got += n
    return view[:got]


def raw(a: np.ndarray) -> memoryview | bytes:
    """The bytes of a C-contiguous array, without a copy (b"" when it is empty: the tail
    of a session that ends on a block boundary)."""
    return a.data.cast("B") if a.size else b""


def write_frame(
    path: Path, magic: bytes, version: int, header: dict[str, Any], k: Any, v: Any
) -> None:
    """Write header and payload atomically (the header gains the payload's dtype, shape,
    size and checksum). Raises OSError, leaving no partial file behind."""
    k, v = np.ascontiguousarray(k), np.ascontiguousarray(v)
    digest = xxhash.xxh3_64(raw(k))
    digest.update(raw(v))
    head = json.dumps({
        **header, "dtype": kv_str(k.dtype), "shape": list(k.shape),
        "payload_bytes": k.nbytes + v.nbytes, "xxh3_64": digest.hexdigest(),
    }).encode()  # fmt: skip
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(PREFIX.pack(magic, version, len(head)))
            f.write(head)
            f.write(raw(k))
            f.write(raw(v))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_header(
    data: bytes | memoryview, kind: tuple[str, bytes, int], max_header: int, name: str
) -> tuple[dict[str, Any], memoryview]:
    """The checked header and the payload's bytes (not yet checked) of a frame of `kind`
    (what it is called, its magic, its version)."""
    what, magic, version = kind
    if len(data) < PREFIX.size:
        raise SpillFileError(name, "truncated before the header")
    got_magic, got_version, header_len = PREFIX.unpack_from(data)
    if got_magic != magic:
        raise SpillFileError(name, f"not a {what} file (magic {got_magic!r})")
    if got_version != version:
        raise SpillFileError(name, f"format version {got_version}, expected {version}")
    if header_len > max_header or PREFIX.size + header_len > len(data):
        raise SpillFileError(name, "truncated header")
    try:
        h = json.loads(bytes(data[PREFIX.size : PREFIX.size + header_len]))
    except ValueError as e:
        raise SpillFileError(name, f"unreadable header ({e})") from e
    if not isinstance(h, dict):
        raise SpillFileError(name, "unreadable header (not an object)")
    return h, memoryview(data)[PREFIX.size + header_len :]


def read_payload(
    h: dict[str, Any], payload: memoryview, shape: list[int], dtype: np.dtype[Any], name: str
) -> tuple[np.ndarray, np.ndarray]:
    """Keys and values of the expected shape and dtype, after checking that the header
    says the same and that the bytes match their checksum."""
    if (h.get("dtype"), h.get("shape")) != (kv_str(dtype), shape):
        raise SpillFileError(name, "dtype or shape differs from the running model")
    half = int(np.prod(shape)) * dtype.itemsize
    if len(payload) != 2 * half or h.get("payload_bytes") != 2 * half:
        raise SpillFileError(name, f"payload is {len(payload)} bytes, expected {2 * half}")
    if xxhash.xxh3_64(payload).hexdigest() != h.get("xxh3_64"):
        raise SpillFileError(name, "checksum mismatch")
    k = np.frombuffer(payload[:half], dtype=dtype).reshape(shape)
    v = np.frombuffer(payload[half:], dtype=dtype).reshape(shape)
    return k, v
