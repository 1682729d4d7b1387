"""The paged KV pool in MLX arrays: the same blocks, block tables and sharing as
engine/kv/kv_pool.py, with another layout.

Each layer has its own keys array and values array [num_blocks * block, kv_heads, head_dim]
(a position's keys in one row), so a step's writes are one scatter per layer and array, by
row number (block * block size + slot). MLX arrays are immutable values, but an update
whose input nothing else holds reuses the input's memory, which one array per layer
ensures: a single array for all layers would be copied whole by every layer's write.

MLX fills a new array at once (NumPy's zero pages are taken only as written), so the arrays
start small and grow, by doubling, to the highest block id in use (the allocator hands out
the lowest free ids first): memory is taken as the pool fills, as on the other devices.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from engine.kv.kv_pool import KVPool
from engine.mlx_backend import mx_dtype

FIRST_BLOCKS = 64  # blocks the arrays hold at first


class MLXKVPool(KVPool):
    def _allocate(self) -> None:
        self.k_layers: list[Any] = []
        self.v_layers: list[Any] = []
        self.allocated_blocks = 0
        self._grow(min(self.num_blocks, FIRST_BLOCKS))

    def _grow(self, blocks: int) -> None:
        """Room for `blocks` blocks in every layer's arrays (zeros appended)."""
        c, dtype = self.config, mx_dtype(self.dtype)
        more = (blocks - self.allocated_blocks) * self.block_size
        for arrays in (self.k_layers, self.v_layers):
            for layer in range(c.num_layers):
                zeros = mx.zeros((more, c.num_kv_heads, c.head_dim), dtype=dtype)
                grown = mx.concatenate([arrays[layer], zeros]) if arrays[layer:] else zeros
                arrays[layer : layer + 1] = [grown]
        self.allocated_blocks = blocks
        mx.eval(self.k_layers, self.v_layers)

    def rows(self, blocks: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """The row of each (block, slot) in a layer's array (grown to hold them)."""
        blocks = np.asarray(blocks, dtype=np.int64)
        if len(blocks) and blocks.max() >= self.allocated_blocks:
            self._grow(min(self.num_blocks, max(2 * self.allocated_blocks, blocks.max() + 1)))
        return (blocks * self.block_size + slots).astype(np.int32)

    def write(self, layer: int, rows: Any, k: Any, v: Any) -> None:
        """One layer's keys and values [n, kv_heads, head_dim] into these rows (mx int32)."""
        self.k_layers[layer][rows] = k
        self.v_layers[layer][rows] = v

    def copy_block(self, dst: int, src: int) -> None:
        self.rows(np.asarray([dst, src]), np.zeros(2, dtype=np.int64))
        b = self.block_size
        for a in (*self.k_layers, *self.v_layers):
            a[dst * b : (dst + 1) * b] = a[src * b : (src + 1) * b]

    def put(self, blocks: np.ndarray, slots: np.ndarray, k: Any, v: Any) -> None:
        rows = mx.array(self.rows(blocks, slots))
        dtype = mx_dtype(self.dtype)
        for layer in range(self.config.num_layers):  # [kv_heads, n, D] -> [n, kv_heads, D]
            keys = mx.array(np.asarray(k[layer]).transpose(1, 0, 2), dtype=dtype)
            values = mx.array(np.asarray(v[layer]).transpose(1, 0, 2), dtype=dtype)
            self.write(layer, rows, keys, values)

    def take(self, blocks: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Host copies [layers, kv_heads, n, head_dim] (what spill files hold)."""
        rows = mx.array(self.rows(blocks, slots))
        k = mx.stack([a[rows] for a in self.k_layers]).transpose(0, 2, 1, 3)
        v = mx.stack([a[rows] for a in self.v_layers]).transpose(0, 2, 1, 3)
        return np.ascontiguousarray(np.array(k)), np.ascontiguousarray(np.array(v))
