"""The worker's KV memory: fixed-size blocks, preallocated, in one pool per block group
(engine/kv/block_groups.py: the layers that see every position, and those of each sliding
window), and the handle each sequence or idle session holds on it (engine/kv/paged_kv.py).

Full blocks are known by the hash of their tokens and of every token before them (scoped by
model and tenant), so a prompt that starts like another one takes the same blocks instead of
computing them again; a block is copied before a holder writes into it while others hold it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from engine.device import device_name, to_host
from engine.kv.block_groups import WINDOW_SHARE, BlockGroup, block_groups
from engine.kv.blocks import BlockAllocator, PoolExhaustedError
from engine.kv.paged_kv import PagedKV
from engine.kv_files.kv_dtypes import (
    Q8_0,
    quantize,
    quantize_bytes,
    row_bytes,
    row_items,
    token_bytes,
)
from engine.kv_files.spill_file import SpilledKV
from engine.ops.elementwise import put_kv_rows
from engine.text.model_config import ModelConfig

Array = Any
BLOCK_TOKENS = 16  # positions per block (see bench/RESULTS.md for the choice)


class KVPool:
    """Per block group g: k_groups[g], v_groups[g] [group's layers, its blocks, kv_heads,
    block, head_dim] (q8_0: head_dim / 32 blocks, kv_dtypes.py; on CUDA, whose arrays hold no
    structured dtype, their bytes: `device_bytes`), a block's positions its slots, and
    allocs[g], which says who holds which. k, v and alloc are the first group's (the only
    one of a model without windows)."""

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        dtype: np.dtype[Any],
        xp: ModuleType,
        fingerprint: str = "",
        block_size: int = BLOCK_TOKENS,
        windows: Sequence[int] = (),
    ) -> None:
        """num_blocks: the first group's; windows: each layer's sliding window (0 or none
        given: every layer sees every position, one group)."""
        self.config = config
        self.dtype = np.dtype(dtype)
        self.xp = xp
        # a q8_0 pool on CUDA: each row its blocks' bytes (uint8 [.., head_dim / 32 * 34]);
        # what comes in or goes out to the host is q8_0 as everywhere (on_device, host_view)
        self.device_bytes = self.dtype == Q8_0 and device_name(xp) == "cuda"
        self.fingerprint = fingerprint
        self.block_size = block_size
        self.groups = block_groups(list(windows) or [0] * config.num_layers)
        self.group_of = [0] * config.num_layers  # each layer's group, and index in it
        self.index_in_group = [0] * config.num_layers
        for g, group in enumerate(self.groups):
            for i, layer in enumerate(group.layers):
                self.group_of[layer], self.index_in_group[layer] = g, i
        self.num_blocks = num_blocks  # every group's (block_groups.py)
        self.group_block_bytes = group_bytes(config, self.groups, self.dtype, block_size)
        self._allocate()
        self.allocs = [
            BlockAllocator(num_blocks, num_blocks // WINDOW_SHARE if g.window else None)
            for g in self.groups
        ]
        self.alloc = self.allocs[0]

    def _allocate(self) -> None:
        c = self.config
        row = row_items(c.head_dim, self.dtype)
        dtype = self.dtype
        if self.device_bytes:
            row, dtype = row_bytes(c.head_dim, self.dtype), np.dtype(np.uint8)
        self.k_groups: list[Array] = []
        self.v_groups: list[Array] = []
        for group in self.groups:
            shape = (len(group.layers), self.num_blocks, c.num_kv_heads, self.block_size, row)
            self.k_groups.append(self.xp.zeros(shape, dtype=dtype))  # zero pages:
            self.v_groups.append(self.xp.zeros(shape, dtype=dtype))  # taken as written
        self.k, self.v = self.k_groups[0], self.v_groups[0]

    def layer_kv(self, layer: int) -> tuple[Array, Array]:
        """A layer's keys and values [its group's blocks, kv_heads, block, head_dim]."""
        g, i = self.group_of[layer], self.index_in_group[layer]
        return self.k_groups[g][i], self.v_groups[g][i]

    # The array operations, where another layout (engine/mlx_backend) differs.
    def copy_block(self, dst: int, src: int, group: int = 0) -> None:
        """Every layer's keys and values of block `src` of a group into its block `dst`."""
        self.k_groups[group][:, dst] = self.k_groups[group][:, src]
        self.v_groups[group][:, dst] = self.v_groups[group][:, src]

    def put(
        self, blocks: np.ndarray, slots: np.ndarray, k: Array, v: Array, group: int = 0
    ) -> None:
        """Keys and values [group's layers, kv_heads, n, head_dim] (host or device) into
        these positions: whole blocks (a restored session) as blocks, the rest one by one."""
        whole = self._whole_blocks(blocks, slots)
        arrays = (self.k_groups[group], self.v_groups[group])
        for pool, src in zip(arrays, (self.on_device(k), self.on_device(v)), strict=True):
            if whole:
                layers, heads, _, d = src.shape
                part = src[:, :, : whole * self.block_size]
                pool[:, blocks[: whole * self.block_size : self.block_size]] = part.reshape(
                    layers, heads, whole, self.block_size, d
                ).transpose(0, 2, 1, 3, 4)
            rest = slice(whole * self.block_size, None)
            pool[:, blocks[rest], :, slots[rest]] = src[:, :, rest].transpose(2, 0, 1, 3)

    def on_device(self, a: Array) -> Array:
        """Keys or values from the host or the device in the pool's module and layout."""
        if self.device_bytes and a.dtype == Q8_0:
            a = np.ascontiguousarray(a).view(np.uint8)
        return self.xp.asarray(a)

    def host_view(self, a: Array) -> np.ndarray:
        """Keys or values the pool gave (take) as a host array of its dtype."""
        host = to_host(a)
        return np.ascontiguousarray(host).view(Q8_0) if self.device_bytes else host

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
        the first layer of their group seen as rows of head_dim; see write_layer."""
        heads = np.arange(self.config.num_kv_heads)
        rows = (blocks[:, None] * len(heads) + heads) * self.block_size + slots[:, None]
        return rows.reshape(-1)

    def row_shift(self, layer: int) -> int:
        """What flat_rows' rows of its group's first layer add up to in `layer`."""
        blocks = self.index_in_group[layer] * self.num_blocks
        return blocks * self.config.num_kv_heads * self.block_size

    def write_layer(self, layer: int, rows: Array, k: Array, v: Array) -> None:
        """One layer's keys and values [n, kv_heads, head_dim] of a step at `rows` (from
        flat_rows for the layer's group, as an array of the pool's module): one indexed
        assignment on a flat view, 30x faster than indexing blocks, heads and slots at once
        (about 1 us against 30); quantized first for a q8_0 pool. On the host with the C
        kernels, one call of theirs for each (NumPy took 3-4x as long, rounding to float16)."""
        at, g = rows + self.row_shift(layer), self.group_of[layer]
        if self.device_bytes:
            k, v = quantize_bytes(k, self.xp), quantize_bytes(v, self.xp)
        elif put_kv_rows((self.k_groups[g], self.v_groups[g]), at, (k, v)):
            return
        elif self.dtype == Q8_0:
            k, v = quantize(k), quantize(v)
        d = self.k_groups[g].shape[-1]
        self.k_groups[g].reshape(-1, d)[at] = k.reshape(-1, d)
        self.v_groups[g].reshape(-1, d)[at] = v.reshape(-1, d)

    def take(self, blocks: np.ndarray, slots: np.ndarray, group: int = 0) -> tuple[Array, Array]:
        """Copies of a group's keys and values at these positions, [group's layers,
        kv_heads, n, head_dim]: whole blocks as block copies, the rest position by position."""
        whole, size = self._whole_blocks(blocks, slots), self.block_size
        out = []
        for pool in (self.k_groups[group], self.v_groups[group]):
            layers, _, heads, _, d = pool.shape
            parts = [
                pool[:, blocks[: whole * size : size]]  # [layers, whole, heads, size, d]
                .transpose(0, 2, 1, 3, 4)
                .reshape(layers, heads, whole * size, d),
                pool[:, blocks[whole * size :], :, slots[whole * size :]].transpose(1, 2, 0, 3),
            ]
            out.append(self.xp.concatenate(parts, axis=2))
        return out[0], out[1]

    def take_kv(self, kv: PagedKV) -> tuple[Array, Array]:
        """Copies of a table's valid keys and values [layers, kv_heads, offset, head_dim]
        (on the host where the pool has windowed groups); a windowed layer's positions
        before kv.held_from() are zeros."""
        if len(self.groups) == 1:
            return self.take(*kv.slots(0, kv.offset))
        c, n = self.config, kv.offset
        shape = (c.num_layers, c.num_kv_heads, n, row_items(c.head_dim, self.dtype))
        k, v = np.zeros(shape, self.dtype), np.zeros(shape, self.dtype)  # on the host
        held_from = kv.held_from()
        for g, group in enumerate(self.groups):
            start = held_from[group.layers[0]]
            gk, gv = self.take(*kv.slots(start, n - start, g), g)
            at = (list(group.layers), slice(None), slice(start, None))
            k[at], v[at] = self.host_view(gk), self.host_view(gv)
        return k, v

    @classmethod
    def sized(
        cls, config: ModelConfig, pool_bytes: int, dtype: np.dtype[Any], xp: ModuleType,
        fingerprint: str = "", block_size: int = BLOCK_TOKENS, windows: Sequence[int] = (),
    ) -> KVPool:  # fmt: skip
        """A pool of as many blocks as fit `pool_bytes` (at least one), a windowed group
        counted at 1 / WINDOW_SHARE of its blocks' bytes (block_groups.py)."""
        groups = block_groups(list(windows) or [0] * config.num_layers)
        sizes = group_bytes(config, groups, np.dtype(dtype), block_size)
        unit = sizes[0] + sum(sizes[1:]) / WINDOW_SHARE
        blocks = max(1, int(pool_bytes // unit))
        return cls(config, blocks, dtype, xp, fingerprint, block_size, windows)

    @property
    def bytes_per_token(self) -> int:
        """KV bytes of one position in every layer (what a model without windows holds)."""
        c = self.config
        return token_bytes(c.num_layers, c.num_kv_heads, c.head_dim, self.dtype)

    @property
    def block_bytes(self) -> int:
        return self.bytes_per_token * self.block_size

    @property
    def host_blocks(self) -> bool:
        """Whether block files may be read straight into this pool's blocks (host memory
        in k_groups' layout: engine/kv/pool_read.py)."""
        return self.xp is np

    def new_kv(self, scope: str = "") -> PagedKV:
        return PagedKV(self, scope)  # empty; `scope` (the tenant) bounds what it may share

    def load(
        self, scope: str, k: Array, v: Array, token_ids: list[int], held_from: Sequence[int] = ()
    ) -> PagedKV:
        """A block table of these tokens holding keys and values [layers, kv_heads, n, D]
        (a windowed layer's from held_from on: PagedKV.held_from)."""
        kv = self.new_kv(scope)
        n = len(token_ids)
        try:  # a full pool (PoolExhaustedError): the blocks taken so far go back
            start = kv.extend_prefix(token_ids, n)  # blocks the pool holds already are taken
            firsts = [start] * len(self.groups)
            for g, group in enumerate(self.groups):
                if held_from and held_from[group.layers[0]] > start:
                    firsts[g] = held_from[group.layers[0]]
                    kv.release_before(g, firsts[g] // self.block_size)
            kv.prepare_write(start, n - start)
        except PoolExhaustedError:
            kv.release()
            raise
        for g, group in enumerate(self.groups):
            if n > firsts[g]:
                layers = slice(None) if len(self.groups) == 1 else list(group.layers)
                cols = slice(firsts[g], None)
                gk, gv = k[layers][:, :, cols], v[layers][:, :, cols]
                self.put(*kv.slots(firsts[g], n - firsts[g], g), gk, gv, g)
        kv.commit(list(token_ids[start:]))
        return kv

    def held_bytes(self, tables: Iterable[PagedKV]) -> int:
        """Bytes of the distinct blocks these tables hold (shared blocks count once)."""
        sizes = self.group_block_bytes
        return sum(sizes[g] for g, _ in {part for t in tables for part in t.held()})


def group_bytes(
    config: ModelConfig, groups: Sequence[BlockGroup], dtype: np.dtype[Any], block_size: int
) -> list[int]:
    """Bytes of one block of each group (all its layers)."""
    c = config
    return [
        token_bytes(len(g.layers), c.num_kv_heads, c.head_dim, dtype) * block_size for g in groups
    ]


def detach(kv: PagedKV) -> SpilledKV:
    """The table's KV and tokens copied to host memory (for a spill file), its blocks freed."""
    k, v, token_ids = kv.state()
    k, v = kv.pool.host_view(k), kv.pool.host_view(v)
    copy = SpilledKV(k, v, token_ids, scope=kv.scope, held_from=kv.held_from())
    kv.release()
    return copy
