"""The paged KV pool in MLX arrays: the same blocks, block tables and sharing as
engine/kv/kv_pool.py, with another layout.

Each layer has its own keys and values, [num_blocks * block, kv_heads, ...] (a position's
keys in one row), so a step's writes are one scatter per layer and array, by row number
(block * block size + slot). MLX arrays are immutable values, but an update whose input
nothing else holds reuses the input's memory, which one array per layer ensures: a single
array for all layers would be copied whole by every layer's write.

A layer's keys (and values) are its planes: one array [rows, kv_heads, head_dim] in float32
or float16, or for q8_0 two, the int8 codes [rows, kv_heads, head_dim] and the float16
scales [rows, kv_heads, head_dim / 32]: llama.cpp's blocks (kv_dtypes.py) split by field,
quantized with the same float32 arithmetic, so the bytes a spill file holds are those any
other device's worker writes. Attention reads rows widened to the compute dtype.

MLX fills a new array at once (NumPy's zero pages are taken only as written), so the arrays
start small and grow, by doubling, to the highest block id in use (the allocator hands out
the lowest free ids first): memory is taken as the pool fills, as on the other devices. A
windowed model's windowed layers have block ids of their own (engine/kv/block_groups.py),
so their arrays grow only as far as the windows in use.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from engine.kv.kv_pool import KVPool
from engine.kv_files.kv_dtypes import Q8_0, Q8_VALUES
from engine.mlx_backend import mx_dtype

FIRST_BLOCKS = 64  # blocks the arrays hold at first


class MLXKVPool(KVPool):
    """Each block group's layers grow their arrays to the group's own highest block id in
    use: a windowed group's stay as small as its windows (engine/kv/block_groups.py)."""

    def _allocate(self) -> None:
        self.k_layers: list[list[Any]] = [[] for _ in range(self.config.num_layers)]
        self.v_layers: list[list[Any]] = [[] for _ in range(self.config.num_layers)]
        self.group_allocated = [0] * len(self.groups)  # blocks each group's arrays hold
        for g in range(len(self.groups)):
            self._grow(g, min(self.num_blocks, FIRST_BLOCKS))

    @property
    def host_blocks(self) -> bool:
        return False  # each layer's arrays of its own (MLX's memory)

    @property
    def allocated_blocks(self) -> int:
        """Blocks the first group's arrays hold."""
        return self.group_allocated[0]

    def _planes(self) -> list[tuple[int, Any]]:
        """(values a row of a head holds, dtype) of each plane."""
        d = self.config.head_dim
        if self.dtype == Q8_0:
            return [(d, mx.int8), (d // Q8_VALUES, mx.float16)]
        return [(d, mx_dtype(self.dtype))]

    def _grow(self, group: int, blocks: int) -> None:
        """Room for `blocks` blocks in the arrays of every layer of a group (zeros
        appended)."""
        heads = self.config.num_kv_heads
        more = (blocks - self.group_allocated[group]) * self.block_size
        for layers in (self.k_layers, self.v_layers):
            for layer in self.groups[group].layers:
                planes = layers[layer]
                if not planes:
                    planes += [mx.zeros((0, heads, n), dtype=t) for n, t in self._planes()]
                for i, (n, t) in enumerate(self._planes()):
                    planes[i] = mx.concatenate([planes[i], mx.zeros((more, heads, n), dtype=t)])
        self.group_allocated[group] = blocks
        mx.eval(self.arrays())

    def arrays(self) -> list[Any]:
        """Every plane of every layer (to evaluate a step's writes)."""
        return [a for planes in (*self.k_layers, *self.v_layers) for a in planes]

    def rows(self, blocks: np.ndarray, slots: np.ndarray, group: int = 0) -> np.ndarray:
        """The row of each (block, slot) in the arrays of a group's layers (grown to hold
        them); a windowed table's released blocks (-1, never read) as block 0's."""
        blocks = np.maximum(np.asarray(blocks, dtype=np.int64), 0)
        held = self.group_allocated[group]
        if len(blocks) and blocks.max() >= held:
            self._grow(group, min(self.num_blocks, max(2 * held, int(blocks.max()) + 1)))
        return (blocks * self.block_size + slots).astype(np.int32)

    def write(self, layer: int, rows: Any, k: Any, v: Any) -> None:
        """One layer's keys and values [n, kv_heads, head_dim] into these rows (mx int32)."""
        for planes, x in ((self.k_layers[layer], k), (self.v_layers[layer], v)):
            for plane, part in zip(planes, self._encode(x), strict=True):
                plane[rows] = part

    def read(self, layer: int, rows: Any, dtype: Any) -> tuple[Any, Any]:
        """One layer's keys and values at these rows (mx int32, any shape [...]) as
        [..., kv_heads, head_dim] in `dtype`."""
        k, v = (
            self._decode([p[rows] for p in planes]).astype(dtype)
            for planes in (self.k_layers[layer], self.v_layers[layer])
        )
        return k, v

    def _encode(self, x: Any) -> list[Any]:
        """Values [..., head_dim] as the planes hold them: q8_0 quantized as
        kv_dtypes.quantize does, in float32."""
        if self.dtype != Q8_0:
            return [x.astype(mx_dtype(self.dtype))]
        blocks = x.astype(mx.float32).reshape(*x.shape[:-1], -1, Q8_VALUES)
        d = mx.abs(blocks).max(axis=-1, keepdims=True) / mx.array(127, dtype=mx.float32)
        inverse = mx.where(d > 0, mx.array(1, dtype=mx.float32) / d, 0)
        codes = mx.round(blocks * inverse).astype(mx.int8).reshape(x.shape)
        return [codes, d[..., 0].astype(mx.float16)]

    def _decode(self, planes: list[Any]) -> Any:
        if self.dtype != Q8_0:
            return planes[0]
        codes, scales = planes
        blocks = codes.astype(mx.float32).reshape(*codes.shape[:-1], -1, Q8_VALUES)
        return (blocks * scales.astype(mx.float32)[..., None]).reshape(codes.shape)

    def copy_block(self, dst: int, src: int, group: int = 0) -> None:
        self.rows(np.asarray([dst, src]), np.zeros(2, dtype=np.int64), group)
        b = self.block_size
        for layer in self.groups[group].layers:
            for a in (*self.k_layers[layer], *self.v_layers[layer]):
                a[dst * b : (dst + 1) * b] = a[src * b : (src + 1) * b]

    def put(self, blocks: np.ndarray, slots: np.ndarray, k: Any, v: Any, group: int = 0) -> None:
        """k, v: [group's layers, kv_heads, n, D] (host)."""
        rows = mx.array(self.rows(blocks, slots, group))
        for i, layer in enumerate(self.groups[group].layers):  # [kv_heads, n, D] -> [n, ...]
            for planes, x in ((self.k_layers[layer], k), (self.v_layers[layer], v)):
                host = np.asarray(x[i]).transpose(1, 0, 2)
                for plane, part in zip(planes, self._split(host), strict=True):
                    plane[rows] = mx.array(part).astype(plane.dtype)

    def take(
        self, blocks: np.ndarray, slots: np.ndarray, group: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Host copies [group's layers, kv_heads, n, head_dim] (what spill files hold)."""
        rows = mx.array(self.rows(blocks, slots, group))
        layers = self.groups[group].layers
        k, v = (
            [self._join([np.array(p[rows]) for p in planes[i]]).transpose(1, 0, 2) for i in layers]
            for planes in (self.k_layers, self.v_layers)
        )
        return np.ascontiguousarray(np.stack(k)), np.ascontiguousarray(np.stack(v))

    def _split(self, host: np.ndarray) -> list[np.ndarray]:
        """A host array of the pool's dtype [..., row] as its planes."""
        if self.dtype != Q8_0:
            return [host]
        return [host["q"].reshape(*host.shape[:-1], -1), host["d"]]

    def _join(self, planes: list[np.ndarray]) -> np.ndarray:
        if self.dtype != Q8_0:
            return planes[0]
        codes, scales = planes
        out = np.empty(scales.shape, dtype=Q8_0)
        out["q"] = codes.reshape(*scales.shape, Q8_VALUES)
        out["d"] = scales
        return out
