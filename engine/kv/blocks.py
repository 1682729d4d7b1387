"""Who holds which block of the KV pool: ids, reference counts and the hashes of full blocks
(shared prefixes). Bookkeeping only: no arrays are touched here.

A block is free, held (its reference count is the number of sequences and idle sessions
that use it), or cached: no longer held but still known by its hash, so that a later prompt
with the same prefix can take it back without recomputing it; cached blocks are reused for
new allocations least recently released first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from common.errors import WarmfleetError


class PoolExhaustedError(WarmfleetError):
    """Every block of the KV pool is held by a running sequence or an idle session."""


class BlockAllocator:
    """With `soft_limit`, blocks are taken lazily: one never used only while fewer than
    soft_limit were, or when no used one is free or cached, so the pages of the pool's
    arrays written grow past soft_limit only as far as the most blocks held at once (a
    windowed group's: block_groups.py). Without, every free block goes before a cached one,
    so cached prefixes last as long as the pool has room."""

    def __init__(self, num_blocks: int, soft_limit: int | None = None) -> None:
        if num_blocks < 1:
            raise ValueError(f"a pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.refs = [0] * num_blocks
        self.soft_limit = num_blocks if soft_limit is None else max(1, soft_limit)
        # pop() gives the lowest id first; a lazy allocator's never used ids are _fresh on
        self._fresh = num_blocks if soft_limit is None else 0
        self._free = list(range(self._fresh - 1, -1, -1))
        self._cached: OrderedDict[int, None] = OrderedDict()  # unheld but hashed, LRU first
        self._hash_of: dict[int, bytes] = {}
        self._by_hash: dict[bytes, int] = {}

    @property
    def num_free(self) -> int:
        """Blocks that an allocation may take (free, or cached and given up)."""
        return len(self._free) + len(self._cached) + self.num_blocks - self._fresh

    @property
    def num_used(self) -> int:
        """Ids ever handed out (all of them but a lazy allocator's)."""
        return self._fresh

    @property
    def num_held(self) -> int:
        return self.num_blocks - self.num_free

    def allocate(self) -> int:
        """A block for this caller alone (reference count 1), not known by any hash."""
        if self._free:
            block = self._free.pop()
        elif self._fresh < self.soft_limit or (not self._cached and self._fresh < self.num_blocks):
            block, self._fresh = self._fresh, self._fresh + 1
        elif self._cached:
            block, _ = self._cached.popitem(last=False)
            del self._by_hash[self._hash_of.pop(block)]
        else:
            raise PoolExhaustedError(f"all {self.num_blocks} KV blocks are in use")
        self.refs[block] = 1
        return block

    def ref(self, block: int) -> None:
        if self.refs[block] == 0:
            self._cached.pop(block)  # only a cached block can be taken back unheld
        self.refs[block] += 1

    def unref(self, blocks: Iterable[int], forget: bool = False) -> None:
        """Hold each block once less; one no longer held is cached if known by a hash,
        unless `forget` (its last holder was deleted: no later prompt may find it)."""
        for block in blocks:
            self.refs[block] -= 1
            assert self.refs[block] >= 0, f"block {block} released more than held"
            if self.refs[block] == 0:
                if forget:
                    self.forget(block)
                if block in self._hash_of:
                    self._cached[block] = None
                else:
                    self._free.append(block)

    def find(self, h: bytes) -> int | None:
        """The block known by `h`, held once more for the caller; None if there is none."""
        block = self._by_hash.get(h)
        if block is not None:
            self.ref(block)
        return block

    def knows(self, h: bytes) -> bool:
        """Whether a block is known by `h` (held or cached), without taking it."""
        return h in self._by_hash

    def publish(self, block: int, h: bytes) -> int:
        """Make a full block known by its hash; the block the caller should hold: `block`,
        or the one already known by `h` (same content: the caller's copy is released)."""
        known = self._by_hash.get(h)
        if known is not None and known != block:
            self.ref(known)
            self.unref([block])
            return known
        self._hash_of[block] = h
        self._by_hash[h] = block
        return block

    def forget(self, block: int) -> None:
        """The block's content is about to change: it is no longer known by its hash."""
        h = self._hash_of.pop(block, None)
        if h is not None:
            del self._by_hash[h]

    def forget_unheld(self, hashes: Iterable[bytes]) -> None:
        """No later prompt finds the blocks known by these hashes that nothing holds (a
        deleted session's, released when it went to disk)."""
        for h in hashes:
            block = self._by_hash.get(h)
            if block is not None and self.refs[block] == 0:
                self._cached.pop(block)
                self.forget(block)
                self._free.append(block)

    def hash_of(self, block: int) -> bytes | None:
        return self._hash_of.get(block)

    def check(self) -> None:
        """Every block is exactly one of free, cached or held (for tests)."""
        held = [b for b, n in enumerate(self.refs) if n > 0]
        assert len(set(self._free)) == len(self._free)
        assert not set(self._free) & set(self._cached)
        assert not set(held) & (set(self._free) | set(self._cached))
        assert len(self._free) + len(self._cached) + len(held) == self._fresh
        assert all(b < self._fresh for b in (*self._free, *self._cached, *held))
        assert all(self._by_hash[h] == b for b, h in self._hash_of.items())


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
