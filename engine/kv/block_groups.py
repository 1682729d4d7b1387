"""Which layers share a block table: the groups of a KV pool.

A model whose layers all see every position has one group. One whose layers attend to a
sliding window (gpt-oss: every other layer, 128 positions) keeps those layers in a group of
their own, with their own blocks and block ids: a sequence's table in that group holds only
the blocks its window can still see, so its bytes there are bounded whatever its length.
A block that leaves the window is released to the pool, where it stays known by its hash
until its room is needed: a later prompt that resumes inside the window history (a turn
whose template rewrote the previous reply, an edited message) takes it back from there
(PagedKV.trim) rather than recomputing from the start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from engine.kv.blocks import BlockAllocator
from engine.text.model_config import ModelConfig

# A pool is sized as if a windowed group took a quarter of the full group's bytes: its
# sequences' windows (about ceil(window / block) + 1 blocks each, a chunk more while
# prefilling) and room for the blocks that left the windows, kept for resumes. It has as
# many block ids as the full group, so that sessions shorter than a few windows never run
# it out first, but takes them lazily (BlockAllocator's soft_limit, that quarter): past it,
# a block that left a window is reused before a new one is taken, so its arrays' pages are
# written only as far as the most blocks held at once.
WINDOW_SHARE = 4
RELEASED = -1  # a windowed table's entry for a block that left the window


@dataclass(frozen=True, slots=True)
class BlockGroup:
    window: int  # the positions its layers attend to (0: every position)
    layers: tuple[int, ...]  # the model's layers in it, in order


def block_groups(windows: Sequence[int]) -> tuple[BlockGroup, ...]:
    """The groups of layers with these windows (one per layer, 0: none): the layers that
    see every position first, then one group per window, smallest first."""
    kinds = sorted(set(windows))
    return tuple(BlockGroup(w, tuple(i for i, x in enumerate(windows) if x == w)) for w in kinds)


def first_needed(end: int, window: int, block: int) -> int:
    """The first block whose keys a row at position `end` or later can still see."""
    return max(0, end + 1 - window) // block if window else 0


def needed_blocks(end: int, window: int, block: int) -> range:
    """The blocks holding the keys a sequence needs to go on computing at position `end`:
    those of positions [end + 1 - window, end) (all of [0, end) without a window)."""
    return range(first_needed(end, window, block), -(-end // block))


class Pool(Protocol):
    """What a block table (engine/kv/paged_kv.py) needs of its pool (kv_pool.py's KVPool)."""

    config: ModelConfig
    dtype: np.dtype[Any]
    fingerprint: str
    block_size: int
    groups: tuple[BlockGroup, ...]
    allocs: list[BlockAllocator]

    @property
    def group_block_bytes(self) -> list[int]: ...

    @property
    def bytes_per_token(self) -> int: ...

    def copy_block(self, dst: int, src: int, group: int = 0) -> None: ...

    def take_kv(self, kv: Any) -> tuple[Any, Any]: ...  # kv: a PagedKV of it

    def host_view(self, a: Any) -> np.ndarray: ...  # what take_kv gave, on the host
