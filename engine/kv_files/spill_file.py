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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.block_hash import chain_hash, prefix_hashes, scope_hash
from common.errors import SpillFileError
from engine.kv_files.block_file import block_path, write_block
from engine.kv_files.block_reads import BlockTarget, SessionBlocks, read_blocks
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


@dataclass(frozen=True, slots=True)
class Listing:
    """A session's file read but for the blocks it lists, which go straight into their
    places in a pool (SpillStore.read_listed); the file is in the reader's KV dtype."""

    key: str
    scope: str
    token_ids: list[int]
    chain: list[bytes]  # the root, then the hash after each listed block
    listed: int  # tokens in the listed blocks; the tail holds those after them
    k_tail: np.ndarray  # [layers, kv_heads, tail tokens, head_dim]
    v_tail: np.ndarray


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
        got = self._open(key, like, np.dtype(dtype))
        if isinstance(got, Listing):
            got = self._filled(got, like)
        return None if got is None else self._converted(got, np.dtype(dtype))

    def read_listing(
        self, key: str, *, like: tuple[int, int, int], dtype: np.dtype[Any]
    ) -> Listing | SpilledKV | None:
        """As read, but a file in `dtype` whose layers hold every position comes back as
        a Listing: its blocks not read yet, for read_listed to put straight into a pool."""
        dtype = np.dtype(dtype)
        got = self._open(key, like, dtype)
        if isinstance(got, Listing):
            if got.k_tail.dtype == dtype:
                return got
            got = self._filled(got, like)
        return None if got is None else self._converted(got, dtype)

    def read_listed(
        self, listing: Listing, target: BlockTarget, first: int = 0, counted: bool = True
    ) -> tuple[int, str]:
        """Read the listed blocks from block `first` on into `target`; the tokens read
        (those of the blocks before the first one that failed, or all of them: the tail is
        the caller's), and why one failed ("" when none did; counted unless not `counted`)."""
        layers, kv_heads, _, row = listing.k_tail.shape
        shape = [layers, kv_heads, self.block_size, row]
        ids = listing.token_ids[: listing.listed]
        got, why = read_blocks(
            self.blocks, self.fingerprint, listing.chain, ids, shape, target, first
        )
        if why and counted:
            self.num_rejected += 1
        return (got if why else len(listing.token_ids)), why

    def prefix_listing(
        self, scope: str, ids: list[int], *, like: tuple[int, int, int], dtype: np.dtype[Any]
    ) -> Listing:
        """A Listing of `ids`'s whole blocks in `dtype` (a prefix another worker of this
        host wrote, or sessions on disk hold), whichever of them are on disk."""
        n = len(ids) // self.block_size * self.block_size
        chain = [self._root(dtype, scope), *self.chain(scope, ids[:n], dtype)]
        k, v = self._arrays(like, 0, dtype)
        return Listing("", scope, ids[:n], chain, n, k, v)

    def read_prefix(
        self, scope: str, ids: list[int], *, like: tuple[int, int, int], dtype: np.dtype[Any]
    ) -> SpilledKV:
        """The KV of the longest run of `ids`'s whole blocks from the start whose block files
        are on disk in `dtype` (prefix_listing), read into arrays of its own. A block
        missing or failing a check (deleted) ends it, uncounted (`incomplete` says why)."""
        listing = self.prefix_listing(scope, ids, like=like, dtype=dtype)
        return self._filled(listing, like, counted=False)

    def _open(
        self, key: str, like: tuple[int, int, int], dtype: np.dtype[Any]
    ) -> Listing | SpilledKV | None:
        """The session's file checked and read (in its own KV dtype) but for its blocks; a
        file whose layers each hold their own part (no blocks) whole."""
        path = self.path_for(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            h, k_tail, v_tail = self._parse(data, like, dtype, str(path))
        except SpillFileError:
            path.unlink(missing_ok=True)
            self.num_rejected += 1
            raise
        ids, scope = [int(t) for t in h["token_ids"]], str(h["scope"])
        if "held_from" in h:  # checked by _parse: no blocks, every layer's own part
            shape = (like[0], like[1], len(ids), row_items(like[2], k_tail.dtype))
            k, v = (unpack(a, h["held_from"], shape, k_tail.dtype) for a in (k_tail, v_tail))
            return SpilledKV(k, v, ids, scope, held_from=tuple(h["held_from"]))
        chain = [self._root(k_tail.dtype, scope), *(bytes.fromhex(b) for b in h["blocks"])]
        listed = len(h["blocks"]) * self.block_size  # (checked against the tokens)
        return Listing(key, scope, ids, chain, listed, k_tail, v_tail)

    def _filled(
        self, listing: Listing, like: tuple[int, int, int], counted: bool = True
    ) -> SpilledKV:
        """A listing's KV in arrays of its own: its blocks read back and followed by the
        tail (or as many blocks as passed their checks; read_listed's `counted`)."""
        k, v = self._arrays(like, len(listing.token_ids), listing.k_tail.dtype)
        k[:, :, listing.listed :], v[:, :, listing.listed :] = listing.k_tail, listing.v_tail
        n, why = self.read_listed(listing, SessionBlocks(k, v, self.block_size), 0, counted)
        return SpilledKV(k[:, :, :n], v[:, :, :n], listing.token_ids[:n], listing.scope, why)

    def _converted(self, kv: SpilledKV, dtype: np.dtype[Any]) -> SpilledKV:
        """`kv` in `dtype` (a file's in another, CONVERTIBLE: counted)."""
        if kv.k.dtype == dtype:
            return kv
        self.num_converted += 1
        k, v = kv.k.astype(dtype), kv.v.astype(dtype)
        was = kv_name(kv.k.dtype)
        return SpilledKV(k, v, kv.token_ids, kv.scope, kv.incomplete, was, kv.held_from)

    @staticmethod
    def _arrays(
        like: tuple[int, int, int], num_tokens: int, dtype: np.dtype[Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        layers, kv_heads, head_dim = like
        shape = (layers, kv_heads, num_tokens, row_items(head_dim, dtype))
        return np.empty(shape, dtype), np.empty(shape, dtype)

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
