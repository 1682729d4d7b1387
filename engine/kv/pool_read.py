"""A session's KV read from its files straight into a host pool's blocks: each block file's
payload lands in the pool's memory with no copy of ours (engine/kv_files/block_file.py's
read_block), where reading into arrays of the session and putting those into the pool
touched every byte three times more (see bench/RESULTS.md, "Disk resumes read straight into
the pool").

The table is made first, on the thread that owns the pool: blocks the pool holds already
(by hash) are taken, the others reserved; the block files are then read into those on
another thread while the pool goes on serving (by the C kernels where built, a reader
thread's share in one call: frame_reads.py, given each piece's address by `addresses`);
the table takes its tokens last, back on the pool's thread, up to the first block that
failed its checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engine.kv.blocks import PoolExhaustedError
from engine.kv.frame_reads import frame_reads
from engine.kv.kv_pool import KVPool
from engine.kv.paged_kv import PagedKV
from engine.kv_files.kv_frame import FrameRead
from engine.kv_files.spill_file import Listing
from engine.ops.native import address


class PoolRead:
    def __init__(self, pool: KVPool, listing: Listing) -> None:
        """The table of `listing`'s tokens, its tail put; its listed blocks from `first`
        on are to be read in place (a spill_file.BlockTarget). PoolExhaustedError, nothing
        held, when the pool has no room (Engine.with_room makes some)."""
        assert pool.host_blocks, "a device pool is loaded from arrays (KVPool.load)"
        self.pool, self.listing = pool, listing
        ids, n = listing.token_ids, len(listing.token_ids)
        self.table = pool.new_kv(listing.scope)
        try:  # a full pool (PoolExhaustedError): the blocks taken so far go back
            self.start = self.table.extend_prefix(ids, n)  # whole blocks: none of the tail
            self.table.prepare_write(self.start, n - self.start)
        except PoolExhaustedError:
            self.table.release()
            raise
        for g, group in enumerate(pool.groups):
            if n > listing.listed:
                layers = slice(None) if len(pool.groups) == 1 else list(group.layers)
                k, v = listing.k_tail[layers], listing.v_tail[layers]
                pool.put(*self.table.slots(listing.listed, n - listing.listed, g), k, v, g)
        # each block's id in every group (read on the readers' threads: a copy), and each
        # layer's (group, index in it)
        self.rows = [list(blocks) for blocks in zip(*self.table.tables, strict=True)]
        every = range(pool.config.num_layers)
        self._places = [(pool.group_of[x], pool.index_in_group[x]) for x in every]
        self.dtype = pool.dtype
        self.direct = self._read_direct if frame_reads() is not None else None
        # each piece of a block's views: its layer's address in block 0, the stride between
        # blocks, the group whose row it takes
        arrays = [(a[g], j, g) for a in (pool.k_groups, pool.v_groups) for g, j in self._places]
        assert all(a.flags.c_contiguous for a, _, _ in arrays)
        self._first = np.array([address(a) + j * a.strides[0] for a, j, _ in arrays], np.int64)
        self._stride = np.array([a.strides[1] for a, _, _ in arrays], np.int64)
        self._group = [g for _, _, g in arrays]

    def _read_direct(
        self, paths: list[Path], blocks: Sequence[int], magic: bytes, version: int
    ) -> list[FrameRead | None]:
        """The blocks' files read whole into their places (block_reads.DirectReader)."""
        reads = frame_reads()
        assert reads is not None
        piece_bytes = int(self._stride[0])  # a piece is a block's row of its layer's array
        return reads.read(paths, self.addresses(blocks), piece_bytes, magic, version)

    def addresses(self, blocks: Sequence[int]) -> np.ndarray:
        """Where each piece of views(i) starts, for each block i of `blocks`: int64
        [blocks, pieces]."""
        rows = np.array([self.rows[i] for i in blocks], np.int64).reshape(len(blocks), -1)
        return self._first + rows[:, self._group] * self._stride

    @property
    def first(self) -> int:
        """The first block to read (those before it the pool held already)."""
        return self.start // self.pool.block_size

    def views(self, i: int) -> list[np.ndarray]:
        """Where block i's payload goes: each layer's keys [kv_heads, block, head_dim] in
        the pool, then each layer's values."""
        pool, row = self.pool, self.rows[i]
        return [a[g][j, row[g]] for a in (pool.k_groups, pool.v_groups) for g, j in self._places]

    def place(self, i: int) -> None:
        pass  # read in place

    def finish(self, got: int) -> PagedKV:
        """The table holding the first `got` tokens (all of them, or those of the blocks
        before the first that failed); the blocks past them released."""
        ids = self.listing.token_ids
        self.table.commit(list(ids[self.start : max(got, self.start)]))
        if got < len(ids):
            self.table.compact()
        return self.table

    def abandon(self) -> None:
        """The read failed: every block of the table given back."""
        self.table.release()
