"""One sequence's (or idle session's) handle on the KV pool: a block table per block group
(engine/kv/block_groups.py), the token ids its positions encode and the hashes of its full
blocks.

A windowed group's table keeps its place for every block (index = block number) but holds
only those its window can still see, from `first_held` on; the entries before are RELEASED.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from common.block_hash import chain_hash, scope_hash
from engine.kv.block_groups import RELEASED, Pool, first_needed, needed_blocks
from engine.kv_files.chain import kv_root

Array = Any


class PagedKV:
    """The KV of positions [0, offset): the same small interface as any cache: offset,
    trim, reserve, commit, nbytes, state."""

    __slots__ = ("first_held", "hashes", "offset", "pool", "root", "scope", "tables", "token_ids")

    def __init__(self, pool: Pool, scope: str) -> None:
        self.pool = pool
        self.scope = scope
        self.root = scope_hash(kv_root(pool.fingerprint, pool.dtype), scope)  # block 0's previous
        self.tables: list[list[int]] = [[] for _ in pool.groups]
        self.first_held = [0] * len(pool.groups)  # a windowed table's first held entry
        self.hashes: list[bytes] = []  # of the full blocks among the first, in order
        self.offset = 0
        self.token_ids: list[int] = []

    @property
    def blocks(self) -> list[int]:
        """The first group's table (the only one of a model without windows)."""
        return self.tables[0]

    @property
    def capacity(self) -> int:
        return len(self.tables[0]) * self.pool.block_size

    def held(self) -> list[tuple[int, int]]:
        """(group, block) of every block it holds."""
        return [(g, b) for g, t in enumerate(self.tables) for b in t[self.first_held[g] :]]

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks it holds (some may be shared with others)."""
        sizes = self.pool.group_block_bytes
        return sum((len(t) - self.first_held[g]) * sizes[g] for g, t in enumerate(self.tables))

    @property
    def bytes_per_token(self) -> int:
        return self.pool.bytes_per_token

    def reserve(self, num_tokens: int) -> None:
        """Blocks for `num_tokens` positions in all (PoolExhaustedError when none is free)."""
        need = -(-num_tokens // self.pool.block_size)
        for table, alloc in zip(self.tables, self.pool.allocs, strict=True):
            while len(table) < need:
                table.append(alloc.allocate())

    def prepare_write(self, start: int, n: int) -> None:
        """Room for positions [start, start + n), and those blocks its own: a block others
        hold too is copied first, and one known by its hash stops being known."""
        if n <= 0:
            return
        self.reserve(start + n)
        size = self.pool.block_size
        for g, (table, alloc) in enumerate(zip(self.tables, self.pool.allocs, strict=True)):
            # (a restored table's windowed group starts where its file's keys do)
            for i in range(max(start // size, self.first_held[g]), (start + n - 1) // size + 1):
                block = table[i]
                assert block != RELEASED, "a write into a block that left the window"
                if alloc.refs[block] > 1:
                    copy = alloc.allocate()
                    self.pool.copy_block(copy, block, g)
                    alloc.unref([block])
                    table[i] = copy
                else:
                    alloc.forget(block)

    def slots(self, start: int, n: int, group: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(block id, slot) of positions [start, start + n) in a group's table."""
        positions = np.arange(start, start + n)
        table = np.asarray(self.tables[group], dtype=np.int64)
        return table[positions // self.pool.block_size], positions % self.pool.block_size

    def commit(self, token_ids: list[int]) -> None:
        """Mark the positions just written for `token_ids` as valid; blocks that became full
        are made known by their hash (one already known with the same content is taken
        instead, and this copy released); windowed blocks no row can see any more are
        released."""
        self.offset += len(token_ids)
        self.token_ids.extend(token_ids)
        size = self.pool.block_size
        while len(self.hashes) < self.offset // size:
            i = len(self.hashes)
            previous = self.hashes[-1] if self.hashes else self.root
            h = chain_hash(previous, self.token_ids[i * size : (i + 1) * size])
            for table, alloc in zip(self.tables, self.pool.allocs, strict=True):
                if table[i] != RELEASED:  # (one a restored file did not hold)
                    table[i] = alloc.publish(table[i], h)
            self.hashes.append(h)
        self._release_behind()

    def _release_behind(self) -> None:
        """Release each windowed table's blocks before those its window needs at offset."""
        size = self.pool.block_size
        for g, table in enumerate(self.tables):
            first = first_needed(self.offset, self.pool.groups[g].window, size)
            self.release_before(g, min(first, len(table)))

    def release_before(self, group: int, block: int) -> None:
        """The group's table holds nothing before `block` any more: the blocks it held there
        are released (a window left them, or a restored session's file starts there)."""
        table, first = self.tables[group], self.first_held[group]
        if block <= first:
            return
        self.pool.allocs[group].unref(table[first : min(block, len(table))])
        table[first:block] = [RELEASED] * (block - first)  # grown to `block` if shorter
        self.first_held[group] = block

    def _missing(self, end: int, ahead: Sequence[bytes] = ()) -> int | None:
        """The last block a windowed table would need to go on at position `end` and can
        neither hold nor take back by hash (`ahead`: the hashes of the blocks after its
        own); None when it can have them all."""
        hashes = [*self.hashes, *ahead]
        size = self.pool.block_size
        for g, table in enumerate(self.tables):
            window, alloc = self.pool.groups[g].window, self.pool.allocs[g]
            if not window:
                continue
            for i in reversed(needed_blocks(end, window, size)):
                held = self.first_held[g] <= i < len(table) and i * size < self.offset
                if not held and (i >= len(hashes) or not alloc.knows(hashes[i])):
                    return i
        return None

    def _take_back(self, end: int) -> None:
        """Take back by hash the windowed blocks needed at `end` that it released."""
        for g, table in enumerate(self.tables):
            window, alloc = self.pool.groups[g].window, self.pool.allocs[g]
            if not window:
                continue
            for i in needed_blocks(end, window, self.pool.block_size):
                if i < self.first_held[g]:
                    block = alloc.find(self.hashes[i])
                    assert block is not None, "checked by _missing"
                    table[i] = block
            self.first_held[g] = min(
                self.first_held[g], first_needed(end, window, self.pool.block_size)
            )

    def extend_prefix(self, prompt: Sequence[int], limit: int) -> int:
        """Take the pool's blocks that hold the next whole blocks of `prompt` (whose first
        `offset` tokens this table holds), up to `limit` tokens, instead of computing them;
        how many tokens were gained. Only a table whose valid positions are whole, hashed
        blocks can take more; a windowed group needs only the blocks its window sees."""
        size = self.pool.block_size
        start = len(self.hashes)
        if self.offset != start * size:
            return 0
        ahead: list[bytes] = []
        full = [a for g, a in zip(self.pool.groups, self.pool.allocs, strict=True) if not g.window]
        previous = self.hashes[-1] if self.hashes else self.root
        while (start + len(ahead) + 1) * size <= limit:
            h = chain_hash(previous, prompt[(start + len(ahead)) * size :][:size])
            if not all(a.knows(h) for a in full):
                break
            ahead.append(h)
            previous = h
        end = start + len(ahead)
        while end > start and (bad := self._missing(end * size, ahead)) is not None:
            end = max(start, bad)
        if end == start:
            return 0
        self._take(ahead[: end - start])
        self.token_ids.extend(prompt[self.offset : end * size])
        self.offset = end * size
        self._take_back(self.offset)
        self._release_behind()
        return (end - start) * size

    def _take(self, ahead: list[bytes]) -> None:
        """Hold the blocks known by these hashes as the next ones of each table (a windowed
        table those its window needs after them only)."""
        start, size = len(self.hashes), self.pool.block_size
        end = start + len(ahead)
        for g, (table, alloc) in enumerate(zip(self.tables, self.pool.allocs, strict=True)):
            lo = first_needed(end * size, self.pool.groups[g].window, size)
            self.release_before(g, lo)  # its own blocks the window leaves, reserved ones too
            for i, h in enumerate(ahead, start):
                block = RELEASED
                if i >= lo:
                    found = alloc.find(h)
                    assert found is not None, "checked by _missing"
                    block = found
                if i < len(table):  # a block reserved for computing these tokens
                    if i >= self.first_held[g]:
                        alloc.unref([table[i]])
                    table[i] = block
                else:
                    table.append(block)
        self.hashes.extend(ahead)

    def trim(self, num_tokens: int) -> int:
        """Keep the first positions, up to `num_tokens`: as many as every windowed table
        can go on from (its window's blocks held, or taken back by hash); blocks past them
        are released. How many were kept."""
        keep, size = max(0, min(num_tokens, self.offset)), self.pool.block_size
        while keep and (bad := self._missing(keep)) is not None:
            keep = bad * size
        for g, (table, alloc) in enumerate(zip(self.tables, self.pool.allocs, strict=True)):
            if self.pool.groups[g].window:  # the blocks past `keep` go: some were released
                cut = -(-keep // size)
                alloc.unref(table[max(cut, self.first_held[g]) :])
                del table[cut:]
                self.first_held[g] = min(self.first_held[g], cut)
        self._take_back(keep)
        self.offset = keep
        del self.token_ids[keep:]
        del self.hashes[keep // size :]
        return keep

    def compact(self) -> None:
        """Release the blocks past the valid positions (an idle session holds what it needs)."""
        keep = -(-self.offset // self.pool.block_size)
        for g, (table, alloc) in enumerate(zip(self.tables, self.pool.allocs, strict=True)):
            alloc.unref(table[max(keep, self.first_held[g]) :])
            del table[keep:]
            self.first_held[g] = min(self.first_held[g], len(table))

    def fork(self) -> PagedKV:
        """Another table of the same blocks (each held once more): a copy that costs no
        bytes until one of the two writes into a shared block (copy on write)."""
        copy = PagedKV(self.pool, self.scope)
        for g, block in self.held():
            self.pool.allocs[g].ref(block)
        copy.tables, copy.first_held = [list(t) for t in self.tables], list(self.first_held)
        copy.hashes, copy.token_ids = list(self.hashes), list(self.token_ids)
        copy.offset = self.offset
        return copy

    def release(self, forget: bool = False) -> None:
        """Give every block back (then empty); `forget`: a deleted session's (unref)."""
        for g, (table, alloc) in enumerate(zip(self.tables, self.pool.allocs, strict=True)):
            alloc.unref(table[self.first_held[g] :], forget)
            if forget:  # and those it released, where nobody took them since
                alloc.forget_unheld(self.hashes[: self.first_held[g]])
        self.tables = [[] for _ in self.tables]
        self.first_held = [0] * len(self.tables)
        self.hashes, self.token_ids, self.offset = [], [], 0

    def held_from(self) -> list[int]:
        """For each of the model's layers, the first position whose keys and values it holds
        (0 but in windowed groups)."""
        out = [0] * self.pool.config.num_layers
        for g, group in enumerate(self.pool.groups):
            for layer in group.layers:
                out[layer] = min(self.first_held[g] * self.pool.block_size, self.offset)
        return out

    def state(self) -> tuple[Array, Array, list[int]]:
        """The valid keys and values [layers, kv_heads, offset, D] (copies; a windowed
        layer's positions before held_from are zeros), and the tokens."""
        return (*self.pool.take_kv(self), list(self.token_ids))
