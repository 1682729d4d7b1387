"""The worker's KV memory: one pool of fixed-size blocks for every layer, preallocated, and
the handle each sequence or idle session holds on it (a block table).

Full blocks are known by the hash of their tokens and of every token before them (scoped by
model and tenant), so a prompt that starts like another one takes the same blocks instead of
computing them again; a block is copied before a holder writes into it while others hold it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from common.block_hash import chain_hash, scope_hash
from engine.device import to_host
from engine.kv.blocks import BlockAllocator
from engine.kv_files.chain import kv_root
from engine.kv_files.kv_dtypes import Q8_0, quantize, row_items, token_bytes
from engine.kv_files.spill_file import SpilledKV
from engine.text.model_config import ModelConfig

Array = Any
BLOCK_TOKENS = 16  # positions per block (see bench/RESULTS.md for the choice)


class KVPool:
    """k, v: [layers, num_blocks, kv_heads, block, head_dim] (q8_0: head_dim / 32 blocks,
    kv_dtypes.py); a block's positions are its slots. The allocator says who holds which."""

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        dtype: np.dtype[Any],
        xp: ModuleType,
        fingerprint: str = "",
        block_size: int = BLOCK_TOKENS,
    ) -> None:
        self.config = config
        self.dtype = np.dtype(dtype)
        self.xp = xp
        self.fingerprint = fingerprint
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._allocate()
        self.alloc = BlockAllocator(num_blocks)

    def _allocate(self) -> None:
        c = self.config
        row = row_items(c.head_dim, self.dtype)
        shape = (c.num_layers, self.num_blocks, c.num_kv_heads, self.block_size, row)
        self.k = self.xp.zeros(shape, dtype=self.dtype)  # zero pages: taken as written
        self.v = self.xp.zeros(shape, dtype=self.dtype)

    # The array operations, where another layout (engine/mlx_backend) differs.
    def copy_block(self, dst: int, src: int) -> None:
        """Every layer's keys and values of block `src` into block `dst`."""
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]

    def put(self, blocks: np.ndarray, slots: np.ndarray, k: Array, v: Array) -> None:
        """Keys and values [layers, kv_heads, n, head_dim] (host or device) into these
        positions: whole blocks (a restored session) as blocks, the rest one by one."""
        whole = self._whole_blocks(blocks, slots)
        for pool, src in ((self.k, self.xp.asarray(k)), (self.v, self.xp.asarray(v))):
            if whole:
                layers, heads, _, d = src.shape
                part = src[:, :, : whole * self.block_size]
                pool[:, blocks[: whole * self.block_size : self.block_size]] = part.reshape(
                    layers, heads, whole, self.block_size, d
                ).transpose(0, 2, 1, 3, 4)
            rest = slice(whole * self.block_size, None)
            pool[:, blocks[rest], :, slots[rest]] = src[:, :, rest].transpose(2, 0, 1, 3)

    def _whole_blocks(self, blocks: np.ndarray, slots: np.ndarray) -> int:
        """How many whole blocks, in order, these positions start with (each block's slots
        0 .. block_size - 1, one block after another)."""
        size = self.block_size
        whole = len(slots) // size
        head_blocks = blocks[: whole * size].reshape(whole, size)
        full = (slots[: whole * size].reshape(whole, size) == np.arange(size)).all(axis=1)
        full &= (head_blocks == head_blocks[:, :1]).all(axis=1)
        return whole if full.all() else int(np.argmin(full))

    def flat_rows(self, blocks: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """[n * kv_heads] (position major): where these positions' keys and values are in
        layer 0 of the pool seen as rows of head_dim; see write_layer."""
        heads = np.arange(self.config.num_kv_heads)
        rows = (blocks[:, None] * len(heads) + heads) * self.block_size + slots[:, None]
        return rows.reshape(-1)

    def row_shift(self, layer: int) -> int:
        """What flat_rows' rows of layer 0 add up to in `layer`."""
        return layer * self.num_blocks * self.config.num_kv_heads * self.block_size

    def write_layer(self, layer: int, rows: Array, k: Array, v: Array) -> None:
        """One layer's keys and values [n, kv_heads, head_dim] of a step at `rows` (from
        flat_rows, as an array of the pool's module): one indexed assignment on a flat view,
        30x faster than indexing blocks, heads and slots at once (about 1 us against 30);
        quantized first for a q8_0 pool."""
        at, d = rows + self.row_shift(layer), row_items(self.config.head_dim, self.dtype)
        if self.dtype == Q8_0:
            k, v = quantize(k), quantize(v)
        self.k.reshape(-1, d)[at] = k.reshape(-1, d)
        self.v.reshape(-1, d)[at] = v.reshape(-1, d)

    def take(self, blocks: np.ndarray, slots: np.ndarray) -> tuple[Array, Array]:
        """Copies of the keys and values at these positions, [layers, kv_heads, n, head_dim]:
        whole blocks as block copies, the rest position by position."""
        whole, size = self._whole_blocks(blocks, slots), self.block_size
        out = []
        for pool in (self.k, self.v):
            layers, _, heads, _, d = pool.shape
            parts = [
                pool[:, blocks[: whole * size : size]]  # [layers, whole, heads, size, d]
                .transpose(0, 2, 1, 3, 4)
                .reshape(layers, heads, whole * size, d),
                pool[:, blocks[whole * size :], :, slots[whole * size :]].transpose(1, 2, 0, 3),
            ]
            out.append(self.xp.concatenate(parts, axis=2))
        return out[0], out[1]

    @classmethod
    def sized(
        cls, config: ModelConfig, pool_bytes: int, dtype: np.dtype[Any], xp: ModuleType,
        fingerprint: str = "", block_size: int = BLOCK_TOKENS,
    ) -> KVPool:  # fmt: skip
        """A pool of as many blocks as fit `pool_bytes` (at least one)."""
        c = config
        per_block = token_bytes(c.num_layers, c.num_kv_heads, c.head_dim, dtype) * block_size
        return cls(config, max(1, pool_bytes // per_block), dtype, xp, fingerprint, block_size)

    @property
    def bytes_per_token(self) -> int:
        c = self.config
        return token_bytes(c.num_layers, c.num_kv_heads, c.head_dim, self.dtype)

    @property
    def block_bytes(self) -> int:
        return self.bytes_per_token * self.block_size

    def new_kv(self, scope: str = "") -> PagedKV:
        return PagedKV(self, scope)  # empty; `scope` (the tenant) bounds what it may share

    def load(self, scope: str, k: Array, v: Array, token_ids: list[int]) -> PagedKV:
        """A block table of these tokens holding keys and values [layers, kv_heads, n, D]."""
        kv = self.new_kv(scope)
        n = len(token_ids)
        start = kv.extend_prefix(token_ids, n)  # blocks the pool holds already are taken
        kv.prepare_write(start, n - start)
        if n > start:
            self.put(*kv.slots(start, n - start), k[:, :, start:], v[:, :, start:])
        kv.commit(list(token_ids[start:]))
        return kv

    def held_bytes(self, tables: Iterable[PagedKV]) -> int:
        """Bytes of the distinct blocks these tables hold (shared blocks count once)."""
        return len({b for t in tables for b in t.blocks}) * self.block_bytes


class PagedKV:
    """One sequence's (or idle session's) KV: the blocks that hold positions [0, offset),
    in order, and the token ids they encode. The same small interface as any cache: offset,
    trim, reserve, commit, nbytes, state."""

    __slots__ = ("blocks", "hashes", "offset", "pool", "root", "scope", "token_ids")

    def __init__(self, pool: KVPool, scope: str) -> None:
        self.pool = pool
        self.scope = scope
        self.root = scope_hash(kv_root(pool.fingerprint, pool.dtype), scope)  # block 0's previous
        self.blocks: list[int] = []
        self.hashes: list[bytes] = []  # of the full blocks among the first, in order
        self.offset = 0
        self.token_ids: list[int] = []

    @property
    def capacity(self) -> int:
        return len(self.blocks) * self.pool.block_size

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks it holds (some may be shared with others)."""
        return len(self.blocks) * self.pool.block_bytes

    @property
    def bytes_per_token(self) -> int:
        return self.pool.bytes_per_token

    def reserve(self, num_tokens: int) -> None:
        """Blocks for `num_tokens` positions in all (PoolExhaustedError when none is free)."""
        while self.capacity < num_tokens:
            self.blocks.append(self.pool.alloc.allocate())

    def prepare_write(self, start: int, n: int) -> None:
        """Room for positions [start, start + n), and those blocks its own: a block others
        hold too is copied first, and one known by its hash stops being known."""
        if n <= 0:
            return
        self.reserve(start + n)
        size, alloc = self.pool.block_size, self.pool.alloc
        for i in range(start // size, (start + n - 1) // size + 1):
            block = self.blocks[i]
            if alloc.refs[block] > 1:
                copy = alloc.allocate()
                self.pool.copy_block(copy, block)
                alloc.unref([block])
                self.blocks[i] = copy
            else:
                alloc.forget(block)

    def slots(self, start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(block id, slot) of positions [start, start + n)."""
        positions = np.arange(start, start + n)
        table = np.asarray(self.blocks, dtype=np.int64)
        return table[positions // self.pool.block_size], positions % self.pool.block_size

    def commit(self, token_ids: list[int]) -> None:
        """Mark the positions just written for `token_ids` as valid; blocks that became full
        are made known by their hash (one already known with the same content is taken
        instead, and this copy released)."""
        self.offset += len(token_ids)
        self.token_ids.extend(token_ids)
        size = self.pool.block_size
        while len(self.hashes) < self.offset // size:
            i = len(self.hashes)
            previous = self.hashes[-1] if self.hashes else self.root
            h = chain_hash(previous, self.token_ids[i * size : (i + 1) * size])
            self.blocks[i] = self.pool.alloc.publish(self.blocks[i], h)
            self.hashes.append(h)

    def extend_prefix(self, prompt: Sequence[int], limit: int) -> int:
        """Take the pool's blocks that hold the next whole blocks of `prompt` (whose first
        `offset` tokens this table holds), up to `limit` tokens, instead of computing them;
        how many tokens were gained. Only a table whose valid positions are whole, hashed
        blocks can take more."""
        size, alloc = self.pool.block_size, self.pool.alloc
        i = len(self.hashes)
        if self.offset != i * size:
            return 0
        while (i + 1) * size <= limit:
            previous = self.hashes[-1] if self.hashes else self.root
            h = chain_hash(previous, prompt[i * size : (i + 1) * size])
            block = alloc.find(h)
            if block is None:
                break
            if i < len(self.blocks):  # a block reserved for computing these tokens
                alloc.unref([self.blocks[i]])
                self.blocks[i] = block
            else:
                self.blocks.append(block)
            self.hashes.append(h)
            i += 1
        gained = i * size - self.offset
        self.token_ids.extend(prompt[self.offset : i * size])
        self.offset = i * size
        return gained

    def trim(self, num_tokens: int) -> None:
        """Keep the first `num_tokens` positions; blocks past them are released."""
        num_tokens = max(0, min(num_tokens, self.offset))
        self.offset = num_tokens
        del self.token_ids[num_tokens:]
        del self.hashes[num_tokens // self.pool.block_size :]

    def compact(self) -> None:
        """Release the blocks past the valid positions (an idle session holds what it needs)."""
        keep = -(-self.offset // self.pool.block_size)
        self.pool.alloc.unref(self.blocks[keep:])
        del self.blocks[keep:]

    def fork(self) -> PagedKV:
        """Another table of the same blocks (each held once more): a copy that costs no
        bytes until one of the two writes into a shared block (copy on write)."""
        copy = PagedKV(self.pool, self.scope)
        for block in self.blocks:
            self.pool.alloc.ref(block)
        copy.blocks, copy.hashes = list(self.blocks), list(self.hashes)
        copy.offset, copy.token_ids = self.offset, list(self.token_ids)
        return copy

    def release(self, forget: bool = False) -> None:
        """Give every block back (then empty); `forget`: a deleted session's (unref)."""
        self.pool.alloc.unref(self.blocks, forget)
        self.blocks, self.hashes, self.token_ids, self.offset = [], [], [], 0

    def state(self) -> tuple[Array, Array, list[int]]:
        """The valid keys and values [layers, kv_heads, offset, D] (copies), and the tokens."""
        return (*self.pool.take(*self.slots(0, self.offset)), list(self.token_ids))


def detach(kv: PagedKV) -> SpilledKV:
    """The table's KV and tokens copied to host memory (for a spill file), its blocks freed."""
    k, v, token_ids = kv.state()
    copy = SpilledKV(to_host(k), to_host(v), token_ids, scope=kv.scope)
    kv.release()
    return copy
