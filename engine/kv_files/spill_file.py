"""Spill files: one session's KV on local disk, checked on every read.

A session's full blocks go to block files shared by every session that holds them (see
block_file); its own file lists them and holds the positions past the last full block.

Layout: a kv_frame with magic b"WFKV", its JSON header holding the session key, tenant,
model fingerprint, layout, block size, token ids and the blocks' hashes; its payload is the
tail, keys and values each [layers, kv_heads, tail tokens, head_dim]. The blocks are written
before the file that lists them. A windowed model's session whose windowed layers hold less
than every position (PagedKV.held_from) lists no blocks: its header says where each layer
starts ("held_from") and its payload holds each layer's part (engine/kv_files/ragged.py).
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.block_hash import chain_hash, prefix_hashes, scope_hash
from common.errors import SpillFileError
from engine.kv_files.block_file import block_path, read_block, write_block
from engine.kv_files.chain import kv_root
from engine.kv_files.kv_dtypes import kv_dtype_named, kv_name, row_items
from engine.kv_files.kv_frame import read_header, read_payload, write_frame
from engine.kv_files.ragged import checked_held_from, pack, packed_items, ragged, unpack
from engine.kv_files.spill_summary import LAYOUT, MAGIC, MAX_HEADER_BYTES, VERSION, read_head
from engine.kv_files.spill_summary import FileSummary as FileSummary
from engine.kv_files.spill_summary import read_summary as read_summary
from engine.kv_files.spill_summary import spill_path as spill_path

# (file's KV dtype, worker's) read back by conversion: float16 to float32 is exact, float32
# to float16 rounds each value as a float16 worker's own writes do
CONVERTIBLE = {("float32", "float16"), ("float16", "float32")}
BLOCKS_DIR = "blocks"
# a worker's answer to another of its host that asked it for a prompt's blocks
# (worker/shared_prefix.py), one empty file each; the kvstore sweeps those left behind
ANSWERS_DIR = "shared"
READ_THREADS = 8  # block files read at once on restore


@functools.cache
def _readers() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(READ_THREADS, thread_name_prefix="block-read")


@dataclass(frozen=True, slots=True)
class SpilledKV:
    k: np.ndarray  # [layers, kv_heads, tokens, head_dim]
    v: np.ndarray
    token_ids: list[int]
    scope: str = ""  # the tenant: blocks are shared within it only
    incomplete: str = ""  # read back: why only a prefix of what was written came back
    converted_from: str = ""  # read back: the file's KV dtype, where it was converted
    # each layer's first position held (a windowed layer's before it are zeros: PagedKV
    # releases what its window no longer sees); empty: every layer holds every position
    held_from: tuple[int, ...] | list[int] = ()


class SpillStore:
    """Spill files of one model in one folder (shared by the workers of a host), their
    blocks in its blocks/ folder."""

    def __init__(self, directory: str | Path, fingerprint: str, block_size: int = 16) -> None:
        self.directory = Path(directory)
        self.blocks = self.directory / BLOCKS_DIR
        self.blocks.mkdir(parents=True, exist_ok=True)
        self.fingerprint = fingerprint
        self.block_size = block_size
        self.num_rejected = 0
        self.num_converted = 0  # files read back in another KV dtype and converted

    def path_for(self, key: str) -> Path:
        return spill_path(self.directory, key)

    def write_blocks(self, kv: SpilledKV) -> tuple[list[str], int]:
        """Write the block files of the KV's whole blocks that are not on disk yet; their
        hashes (hex) in order, and the bytes newly written."""
        size, ids = self.block_size, list(kv.token_ids)
        previous, added = self._root(kv.k.dtype, kv.scope), 0
        hashes: list[str] = []
        if ragged(kv.held_from):  # some layer's blocks are not all there: none is whole
            return hashes, added
        for i in range(len(ids) // size):
            part, cols = ids[i * size : (i + 1) * size], slice(i * size, (i + 1) * size)
            k, v = kv.k[:, :, cols], kv.v[:, :, cols]
            added += write_block(self.blocks, self.fingerprint, previous, part, k, v)
            previous = chain_hash(previous, part)
            hashes.append(previous.hex())
        return hashes, added

    def write(self, key: str, kv: SpilledKV) -> FileSummary:
        """Write the blocks not on disk yet, then the session's file, atomically. Raises
        OSError (e.g. disk full), leaving no partial file behind."""
        hashes, added = self.write_blocks(kv)
        size, ids = self.block_size, list(kv.token_ids)
        start, path = len(hashes) * size, self.path_for(key)
        header: dict[str, Any] = {"key": key, "scope": kv.scope, "fingerprint": self.fingerprint}
        header |= {"layout": LAYOUT, "block_size": size, "token_ids": ids, "blocks": hashes}
        k, v = kv.k[:, :, start:], kv.v[:, :, start:]
        if ragged(kv.held_from):
            header["held_from"] = list(kv.held_from)
            k, v = pack(kv.k, kv.v, kv.held_from)
        write_frame(path, MAGIC, VERSION, header, k, v)
        st = path.stat()
        return FileSummary(key, st.st_size + added, st.st_mtime_ns, len(ids), tuple(hashes))

    def read(
        self, key: str, *, like: tuple[int, int, int], dtype: np.dtype[Any]
    ) -> SpilledKV | None:
        """The session's KV in `dtype`, or None when there is no file. A file failing any
        check is deleted, counted, and reported as SpillFileError; a block failing one is
        deleted and counted, and the blocks before it come back (`incomplete` says why).
        `like` is (layers, kv_heads, head_dim) of the running model (values: a q8_0 file's
        rows hold head_dim / 32 blocks). A file in another KV
        dtype is converted where CONVERTIBLE says so (counted in num_converted), else
        refused like a file failing a check."""
        path = self.path_for(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        dtype = np.dtype(dtype)
        try:
            h, k_tail, v_tail = self._parse(data, like, dtype, str(path))
        except SpillFileError:
            path.unlink(missing_ok=True)
            self.num_rejected += 1
            raise
        kv = self._assemble(h, k_tail, v_tail, like, k_tail.dtype)
        if kv.k.dtype == dtype:
            return kv
        self.num_converted += 1
        k, v = kv.k.astype(dtype), kv.v.astype(dtype)
        was = kv_name(kv.k.dtype)
        return SpilledKV(k, v, kv.token_ids, kv.scope, kv.incomplete, was, kv.held_from)

    def read_prefix(
        self, scope: str, ids: list[int], *, like: tuple[int, int, int], dtype: np.dtype[Any]
    ) -> SpilledKV:
        """The KV of the longest run of `ids`'s whole blocks from the start whose block files
        are on disk in `dtype` (a prefix another worker of this host wrote: no conversion),
        read straight into place. A block missing or failing a check (deleted) ends it."""
        n = len(ids) // self.block_size * self.block_size
        k, v = self._arrays(like, n, dtype)
        hashes = [self._root(dtype, scope), *self.chain(scope, ids[:n], dtype)]
        got, _ = self._read_blocks(hashes, ids[:n], k, v)
        return SpilledKV(k[:, :, :got], v[:, :, :got], ids[:got], scope)

    def _assemble(
        self, h: dict[str, Any], k_tail: np.ndarray, v_tail: np.ndarray,
        like: tuple[int, int, int], dtype: np.dtype[Any],
    ) -> SpilledKV:  # fmt: skip
        """The listed blocks read back and followed by the tail (or as many blocks as
        passed their checks)."""
        ids = [int(t) for t in h["token_ids"]]
        if "held_from" in h:  # checked by _parse: no blocks, every layer's own part
            shape = (like[0], like[1], len(ids), row_items(like[2], dtype))
            k, v = (unpack(a, h["held_from"], shape, dtype) for a in (k_tail, v_tail))
            return SpilledKV(k, v, ids, str(h["scope"]), held_from=tuple(h["held_from"]))
        listed = len(h["blocks"]) * self.block_size
        k, v = self._arrays(like, len(ids), dtype)
        k[:, :, listed:], v[:, :, listed:] = k_tail, v_tail
        hashes = [self._root(dtype, h["scope"])]
        hashes += [bytes.fromhex(b) for b in h["blocks"]]  # checked against the tokens
        got, why = self._read_blocks(hashes, ids[:listed], k, v)
        if why:
            self.num_rejected += 1
        n = len(ids) if not why else got
        return SpilledKV(k[:, :, :n], v[:, :, :n], ids[:n], str(h["scope"]), why)

    @staticmethod
    def _arrays(
        like: tuple[int, int, int], num_tokens: int, dtype: np.dtype[Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        layers, kv_heads, head_dim = like
        shape = (layers, kv_heads, num_tokens, row_items(head_dim, dtype))
        return np.empty(shape, dtype), np.empty(shape, dtype)

    def _read_blocks(
        self, hashes: list[bytes], ids: list[int], k: np.ndarray, v: np.ndarray
    ) -> tuple[int, str]:
        """Read the blocks of `ids` (whole blocks; `hashes`: the root, then the chain hash
        after each) into their places in k and v; the tokens read before the first block
        that failed, and why it failed ("" when none did)."""
        size = self.block_size

        def one(i: int) -> None:
            cols = slice(i * size, (i + 1) * size)
            out = (k[:, :, cols], v[:, :, cols])
            read_block(self.blocks, self.fingerprint, hashes[i], ids[cols], out)

        # many small files: read a few at once (one at a time is latency-bound on a cold
        # cache), each straight into its place; the blocks after a bad one are not used
        futures = [_readers().submit(one, i) for i in range(len(ids) // size)]
        for i, future in enumerate(futures):
            try:
                future.result()
            except SpillFileError as e:
                for rest in futures[i + 1 :]:
                    rest.exception()  # each read has landed (or failed) before the arrays go
                return i * size, e.reason
        return len(ids), ""

    def _parse(
        self, data: bytes, like: tuple[int, int, int], dtype: np.dtype[Any], name: str
    ) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
        """The header and the tail's keys and values of a session's file, all checked; the
        tail in the file's own KV dtype where `dtype` may be had from it by conversion."""
        h, payload = read_header(data, ("spill", MAGIC, VERSION), MAX_HEADER_BYTES, name)
        dtype = self._file_dtype(h, dtype, name)
        if h.get("fingerprint") != self.fingerprint:
            raise SpillFileError(name, "written by another model (fingerprint differs)")
        if (h.get("layout"), h.get("block_size")) != (LAYOUT, self.block_size):
            raise SpillFileError(name, "layout or block size differs from the running model")
        ids, blocks = h.get("token_ids", []), h.get("blocks", [])
        if blocks != self._chain(str(h.get("scope")), ids, len(blocks), dtype):
            raise SpillFileError(name, "its blocks are not those of its tokens")
        layers, kv_heads, head_dim = like
        row = row_items(head_dim, dtype)
        shape = [layers, kv_heads, len(ids) - len(blocks) * self.block_size, row]
        if "held_from" in h:
            shape = [packed_items(checked_held_from(h, layers, name), shape)]
        k, v = read_payload(h, payload, shape, dtype, name)
        return h, k, v

    def _chain(self, scope: str, ids: list[int], num_blocks: int, dtype: Any) -> list[str]:
        return [h.hex() for h in self.chain(scope, ids[: num_blocks * self.block_size], dtype)]

    def chain(self, scope: str, ids: list[int], dtype: Any) -> list[bytes]:
        """The hash after each whole block of `ids` (their block files' names)."""
        return prefix_hashes(self._root(dtype, scope), ids, self.block_size)

    def token_hashes(self, key: str) -> list[bytes]:
        """The chain hash after each whole block of a session's file's tokens (what a pool
        may still know of it), from its header alone; [] when there is none to read."""
        head = read_head(self.path_for(key))
        try:
            h = head[0] if head else {}
            ids, dtype = [int(t) for t in h["token_ids"]], kv_dtype_named(h["dtype"])
            return self.chain(str(h["scope"]), ids, dtype)
        except (KeyError, TypeError, ValueError):
            return []

    def has_block(self, h: bytes) -> bool:
        return block_path(self.blocks, h).exists()

    def _root(self, dtype: Any, scope: str) -> bytes:
        return scope_hash(kv_root(self.fingerprint, dtype), scope)

    @staticmethod
    def _file_dtype(h: dict[str, Any], dtype: np.dtype[Any], name: str) -> np.dtype[Any]:
        """The dtype to read the file's KV in: `dtype`, or the file's own where it converts
        to `dtype` (CONVERTIBLE); SpillFileError for any other."""
        try:
            held = kv_dtype_named(h.get("dtype"))
        except TypeError:
            raise SpillFileError(name, f"unknown KV dtype {h.get('dtype')!r}") from None
        if held == dtype or (kv_name(held), kv_name(dtype)) in CONVERTIBLE:
            return held
        raise SpillFileError(
            name, f"KV in {kv_name(held)}, not convertible to this worker's {kv_name(dtype)}"
        )

    def delete(self, key: str) -> bool:
        path = self.path_for(key)
        existed = path.exists()
        path.unlink(missing_ok=True)
        return existed
