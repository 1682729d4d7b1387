"""Per-sequence KV cache: contiguous buffers that grow in blocks while a request runs and
shrink to what they hold when it ends, with exact byte accounting."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from engine.config import ModelConfig

Array = Any
GROW_TOKENS = 256  # capacity grows in multiples of this many positions


class KVCache:
    """Keys and values of one sequence for every layer, plus the token ids they encode.

    Layout: k and v are [num_layers, num_kv_heads, capacity, head_dim]; positions
    [0, offset) are valid. The rope layout is split halves (see weights.rope_halves_order).
    """

    __slots__ = ("config", "dtype", "k", "offset", "token_ids", "v", "xp")

    def __init__(self, config: ModelConfig, dtype: np.dtype[Any], xp: ModuleType) -> None:
        self.config = config
        self.dtype = np.dtype(dtype)
        self.xp = xp
        self.k: Array = self._alloc(0)
        self.v: Array = self._alloc(0)
        self.offset = 0
        self.token_ids: list[int] = []

    def _alloc(self, capacity: int) -> Array:
        c = self.config
        shape = (c.num_layers, c.num_kv_heads, capacity, c.head_dim)
        return self.xp.empty(shape, dtype=self.dtype)

    @property
    def capacity(self) -> int:
        return int(self.k.shape[2])

    @property
    def nbytes(self) -> int:
        """Bytes held (allocated capacity, not just valid positions)."""
        return int(self.k.nbytes + self.v.nbytes)

    @property
    def bytes_per_token(self) -> int:
        c = self.config
        return 2 * c.num_layers * c.kv_dim * self.dtype.itemsize

    def reserve(self, num_tokens: int) -> None:
        """Make room for `num_tokens` positions in total (grows in GROW_TOKENS blocks)."""
        if num_tokens <= self.capacity:
            return
        capacity = -(-num_tokens // GROW_TOKENS) * GROW_TOKENS
        for name in ("k", "v"):
            grown = self._alloc(capacity)
            grown[:, :, : self.offset] = getattr(self, name)[:, :, : self.offset]
            setattr(self, name, grown)

    def compact(self) -> None:
        """Give back the capacity beyond the valid positions (an idle session holds
        exactly its tokens' KV, and its bytes say so)."""
        if self.capacity == self.offset:
            return
        for name in ("k", "v"):
            exact = self._alloc(self.offset)
            exact[...] = getattr(self, name)[:, :, : self.offset]
            setattr(self, name, exact)

    def trim(self, num_tokens: int) -> None:
        """Keep the first `num_tokens` positions; the rest is forgotten (capacity kept)."""
        num_tokens = max(0, min(num_tokens, self.offset))
        self.offset = num_tokens
        del self.token_ids[num_tokens:]

    def write(self, layer: int, start: int, k: Array, v: Array) -> None:
        """Store k, v [num_kv_heads, n, head_dim] at positions [start, start + n) of a layer."""
        n = k.shape[1]
        self.k[layer, :, start : start + n] = k
        self.v[layer, :, start : start + n] = v

    def commit(self, token_ids: list[int]) -> None:
        """Mark the positions just written for `token_ids` as valid."""
        self.offset += len(token_ids)
        self.token_ids.extend(token_ids)

    def state(self) -> tuple[Array, Array, list[int]]:
        """The valid keys, values and token ids (copies), for spilling or forking."""
        return (
            self.k[:, :, : self.offset].copy(),
            self.v[:, :, : self.offset].copy(),
            list(self.token_ids),
        )

    @classmethod
    def from_state(
        cls, config: ModelConfig, xp: ModuleType, k: Array, v: Array, token_ids: list[int]
    ) -> KVCache:
        """A cache holding exactly these positions (no spare capacity)."""
        cache = cls(config, k.dtype, xp)
        cache.k = xp.array(k, dtype=cache.dtype, order="C")  # a copy: k may be read-only
        cache.v = xp.array(v, dtype=cache.dtype, order="C")
        cache.commit(list(token_ids))
        return cache


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
