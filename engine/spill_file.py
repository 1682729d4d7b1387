"""Spill files: one session's KV on local disk, checked on every read.

Layout: b"WFKV", a little-endian u32 format version, a u32 header length, a JSON header
(model fingerprint, dtype, layout, shape, token ids, payload size, xxh3-64 of the payload),
then the payload: keys then values, each [layers, kv_heads, tokens, head_dim] C-ordered.
Files are written to a temporary name, flushed, fsynced and renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from common.errors import SpillFileError

MAGIC = b"WFKV"
VERSION = 2  # 2: the header names the session (key)
LAYOUT = "k,v;layers,kv_heads,tokens,head_dim"
_PREFIX = struct.Struct("<4sII")
MAX_HEADER_BYTES = 16 << 20


def spill_path(directory: Path, key: str) -> Path:
    """A fixed, filesystem-safe name for a session key (tenant/session id)."""
    return directory / f"{hashlib.sha256(key.encode()).hexdigest()[:40]}.wfkv"


@dataclass(frozen=True, slots=True)
class FileSummary:
    key: str
    size: int
    mtime_ns: int
    num_tokens: int


def read_summary(path: Path) -> FileSummary | None:
    """The session a spill file holds, from its header alone (no payload check); None when
    the file is gone or its header cannot be read."""
    try:
        with path.open("rb") as f:
            st = os.fstat(f.fileno())
            magic, version, header_len = _PREFIX.unpack(f.read(_PREFIX.size))
            if magic != MAGIC or version != VERSION or header_len > MAX_HEADER_BYTES:
                return None
            h = json.loads(f.read(header_len))
        return FileSummary(str(h["key"]), st.st_size, st.st_mtime_ns, len(h["token_ids"]))
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None


@dataclass(frozen=True, slots=True)
class SpilledKV:
    k: np.ndarray  # [layers, kv_heads, tokens, head_dim]
    v: np.ndarray
    token_ids: list[int]


class SpillStore:
    """Spill files of one model in one folder (shared by the workers of a host)."""

    def __init__(self, directory: str | Path, fingerprint: str) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fingerprint = fingerprint
        self.num_rejected = 0

    def path_for(self, key: str) -> Path:
        return spill_path(self.directory, key)

    def write(self, key: str, kv: SpilledKV) -> FileSummary:
        """Write atomically. Raises OSError (e.g. disk full), leaving no partial file behind."""
        k, v = np.ascontiguousarray(kv.k), np.ascontiguousarray(kv.v)
        digest = xxhash.xxh3_64(k.data.cast("B"))
        digest.update(v.data.cast("B"))
        header = json.dumps(
            {
                "key": key,
                "fingerprint": self.fingerprint,
                "dtype": k.dtype.str,
                "layout": LAYOUT,
                "shape": list(k.shape),
                "token_ids": list(kv.token_ids),
                "payload_bytes": k.nbytes + v.nbytes,
                "xxh3_64": digest.hexdigest(),
            }
        ).encode()
        path = self.path_for(key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with tmp.open("wb") as f:
                f.write(_PREFIX.pack(MAGIC, VERSION, len(header)))
                f.write(header)
                f.write(k.data.cast("B"))
                f.write(v.data.cast("B"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        st = path.stat()
        return FileSummary(key, st.st_size, st.st_mtime_ns, len(kv.token_ids))

    def read(
        self, key: str, *, like: tuple[int, int, int], dtype: np.dtype[Any]
    ) -> SpilledKV | None:
        """The session's KV, or None when there is no file. A file failing any check is
        deleted, counted, and reported as SpillFileError. `like` is (layers, kv_heads,
        head_dim) of the running model."""
        path = self.path_for(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return self._parse(data, like, np.dtype(dtype), str(path))
        except SpillFileError:
            path.unlink(missing_ok=True)
            self.num_rejected += 1
            raise

    def _parse(
        self, data: bytes, like: tuple[int, int, int], dtype: np.dtype[Any], name: str
    ) -> SpilledKV:
        if len(data) < _PREFIX.size:
            raise SpillFileError(name, "truncated before the header")
        magic, version, header_len = _PREFIX.unpack_from(data)
        if magic != MAGIC:
            raise SpillFileError(name, f"not a spill file (magic {magic!r})")
        if version != VERSION:
            raise SpillFileError(name, f"format version {version}, expected {VERSION}")
        if header_len > MAX_HEADER_BYTES or _PREFIX.size + header_len > len(data):
            raise SpillFileError(name, "truncated header")
        try:
            h = json.loads(data[_PREFIX.size : _PREFIX.size + header_len])
        except ValueError as e:
            raise SpillFileError(name, f"unreadable header ({e})") from e
        if h.get("fingerprint") != self.fingerprint:
            raise SpillFileError(name, "written by another model (fingerprint differs)")
        layers, kv_heads, head_dim = like
        n = len(h.get("token_ids", []))
        if (h.get("layout"), h.get("dtype")) != (LAYOUT, dtype.str) or h.get("shape") != [
            layers,
            kv_heads,
            n,
            head_dim,
        ]:
            raise SpillFileError(name, "dtype or layout differs from the running model")
        payload = memoryview(data)[_PREFIX.size + header_len :]
        half = layers * kv_heads * n * head_dim * dtype.itemsize
        if len(payload) != 2 * half or h.get("payload_bytes") != 2 * half:
            raise SpillFileError(name, f"payload is {len(payload)} bytes, expected {2 * half}")
        if xxhash.xxh3_64(payload).hexdigest() != h.get("xxh3_64"):
            raise SpillFileError(name, "checksum mismatch")
        shape = (layers, kv_heads, n, head_dim)
        k = np.frombuffer(payload[:half], dtype=dtype).reshape(shape)
        v = np.frombuffer(payload[half:], dtype=dtype).reshape(shape)
        return SpilledKV(k, v, [int(t) for t in h["token_ids"]])

    def delete(self, key: str) -> bool:
        path = self.path_for(key)
        existed = path.exists()
        path.unlink(missing_ok=True)
        return existed
