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
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import xxhash

from common.errors import SpillFileError
from engine.kv_files.kv_dtypes import kv_str

PREFIX = struct.Struct("<4sII")
HEAD_READ = 4096  # bytes read first from a frame read in place: a block file's whole header
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


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
    # one name per thread: two threads of a process may write the same block at once
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_native_id()}.tmp")
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
    half = _checked_half(h, len(payload), shape, dtype, name)
    _check_sum(h, [payload], name)
    k = np.frombuffer(payload[:half], dtype=dtype).reshape(shape)
    v = np.frombuffer(payload[half:], dtype=dtype).reshape(shape)
    return k, v


def read_into(
    path: Path,
    kind: tuple[str, bytes, int],
    max_header: int,
    shape: list[int],
    out: Sequence[np.ndarray],
) -> dict[str, Any]:
    """Read a frame of `kind` whose keys and values are each `shape` in out[0]'s dtype
    straight into `out`, C-contiguous arrays whose bytes one after another are the payload
    (the keys', then the values'), with the checks of read_header and read_payload; its
    header, whose own fields are the caller's to check. No bytes pass through a buffer of
    ours. Raises FileNotFoundError and other OSErrors, and SpillFileError; `out` then holds
    whatever was read."""
    name = str(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, HEAD_READ, 0)
        if len(head) >= PREFIX.size:  # a longer header than HEAD_READ: the rest of it
            end = PREFIX.size + min(PREFIX.unpack_from(head)[2], max_header)
            if end > len(head):
                head += os.pread(fd, end - len(head), len(head))
        h, rest = read_header(head, kind, max_header, name)
        offset = len(head) - len(rest)
        _checked_half(h, size - offset, shape, out[0].dtype, name)
        os.lseek(fd, offset, os.SEEK_SET)  # (readv, not preadv: macOS has it too)
        for i in range(0, len(out), IOV_MAX):
            part = out[i : i + IOV_MAX]
            want = sum(a.nbytes for a in part)
            got = os.readv(fd, [a.data for a in part])
            if got != want:  # shrunk since its size was read
                raise SpillFileError(name, f"payload cut short ({got} of {want} bytes read)")
    finally:
        os.close(fd)
    _check_sum(h, out, name)
    return h


class FrameRead(NamedTuple):
    """A frame read whole by another reader (engine/kv/frame_reads.py, in C), its payload
    already in place: its prefix and header, its payload's size and xxh3-64 (hex)."""

    head: bytes
    payload_bytes: int
    digest: str


def checked_frame(
    frame: FrameRead,
    kind: tuple[str, bytes, int],
    max_header: int,
    shape: list[int],
    dtype: np.dtype[Any],
    name: str,
) -> dict[str, Any]:
    """The header of a frame read whole elsewhere, with read_into's checks."""
    h, _ = read_header(frame.head, kind, max_header, name)
    _checked_half(h, frame.payload_bytes, shape, dtype, name)
    if frame.digest != h.get("xxh3_64"):
        raise SpillFileError(name, "checksum mismatch")
    return h


def _checked_half(
    h: dict[str, Any], payload_bytes: int, shape: list[int], dtype: np.dtype[Any], name: str
) -> int:
    """The bytes of the keys (and of the values) of a payload of `payload_bytes`, after
    checking the header's dtype, shape and size."""
    if (h.get("dtype"), h.get("shape")) != (kv_str(dtype), shape):
        raise SpillFileError(name, "dtype or shape differs from the running model")
    half = int(np.prod(shape)) * dtype.itemsize
    if payload_bytes != 2 * half or h.get("payload_bytes") != 2 * half:
        raise SpillFileError(name, f"payload is {payload_bytes} bytes, expected {2 * half}")
    return half


def _check_sum(h: dict[str, Any], parts: Sequence[Any], name: str) -> None:
    digest = xxhash.xxh3_64()
    for part in parts:
        digest.update(part)
    if digest.hexdigest() != h.get("xxh3_64"):
        raise SpillFileError(name, "checksum mismatch")
