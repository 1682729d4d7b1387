"""Reading a session's block files back (block_file.read_block) into where they go: a
pool's blocks (engine/kv/pool_read.py) or a session's own arrays (SessionBlocks), by a few
threads at once; where the target can (a pool's, with the C kernels built), each thread's
share of the files in one call off the GIL (its DirectReader), their checks after."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from common.block_hash import chain_hash
from common.errors import SpillFileError
from common.priority import lower_thread_priority
from engine.kv_files.block_file import MAGIC, VERSION, advise, block_path, read_block, read_whole
from engine.kv_files.kv_frame import FrameRead

# threads reading a session's block files, each every READ_THREADS-th one: the disk has
# every read queued at once (block_file.advise), and each reader's checks hold the GIL
# part of the time
READ_THREADS = min(8, max(2, os.cpu_count() or 1))
# added to the readers' nice value: their copies and checksums wait for the threads
# decoding the other sessions, whose steps take every core (OpenMP, which waits at each
# barrier for a thread a reader displaced). On 2 cores, restores from the page cache back
# to back stretched a batch's decode step from ~25 ms to ~120 at nice + 0, to 35-67 at
# + 10, while a restore beside the batch took 20-33 ms for 15-20 (bench.restore_readers);
# alone, the same.
READ_NICE = 10


@functools.cache
def _readers() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(
        READ_THREADS,
        thread_name_prefix="block-read",
        initializer=lower_thread_priority,
        initargs=(READ_NICE,),
    )


class DirectReader(Protocol):
    def __call__(
        self, paths: list[Path], blocks: Sequence[int], magic: bytes, version: int
    ) -> list[FrameRead | None]:
        """The files of `blocks`, frames of `magic` and `version`, each read whole straight
        into where the block goes (None for a file missing, or found wrong before its
        header's fields are looked at)."""


class BlockTarget(Protocol):
    """Where the blocks of a session read back go."""

    # reads whole files into place, off the GIL; None: each block read into its views
    direct: DirectReader | None
    dtype: np.dtype[Any]  # of the blocks' keys and values

    def views(self, i: int) -> list[np.ndarray]:
        """Where block i's payload is read (block_file.read_block's `out`)."""

    def place(self, i: int) -> None:
        """Block i was read and passed its checks (on the thread that read it)."""


def read_blocks(
    directory: Path,
    fingerprint: str,
    chain: list[bytes],
    ids: list[int],
    shape: list[int],
    target: BlockTarget,
    first: int = 0,
) -> tuple[int, str]:
    """Read the blocks of `ids` (`chain`: the root, then the hash after each block; each
    block's keys and values `shape`, [layers, kv_heads, block, head_dim]) from block
    `first` on into `target`; the tokens read before the first block that failed (all of
    `ids` when none did), and why it failed ("")."""
    size = shape[2]
    count = len(ids) // size

    def every(step: int) -> tuple[int, str]:
        """Blocks first + step, + READ_THREADS more, ... in order: the first that failed
        (count: none) and why."""
        blocks = range(first + step, count, READ_THREADS)
        parts = {i: ids[i * size : (i + 1) * size] for i in blocks}
        whole = _read_direct(directory, fingerprint, chain, parts, shape, target)
        for i, part in parts.items():
            try:  # a file the direct read did not take: read again, which says why
                if i not in whole:
                    read_block(directory, fingerprint, chain[i], part, shape, target.views(i))
            except SpillFileError as e:
                return i, e.reason
            target.place(i)
        return count, ""

    # many small files: their reads queued at once (a direct reader asks itself), then each
    # of a few readers puts every few straight into place; the blocks after the first bad
    # one are not used
    if target.direct is None:
        advise(directory, chain[first + 1 : count + 1])
    futures = [_readers().submit(every, step) for step in range(READ_THREADS)]
    bad, why = min(future.result() for future in futures)  # every read has landed
    return (bad * size, why) if why else (len(ids), "")


def _read_direct(
    directory: Path,
    fingerprint: str,
    chain: list[bytes],
    parts: dict[int, list[int]],
    shape: list[int],
    target: BlockTarget,
) -> set[int]:
    """The blocks of `parts` (block: its tokens) the target's direct reader read whole and
    which passed every check (none without one)."""
    if target.direct is None or not parts:
        return set()
    paths = [block_path(directory, chain_hash(chain[i], part)) for i, part in parts.items()]
    frames = target.direct(paths, list(parts), MAGIC, VERSION)
    checks = zip(parts.items(), paths, frames, strict=True)
    dtype = target.dtype
    return {
        i
        for (i, part), path, frame in checks
        if read_whole(frame, str(path), fingerprint, chain[i], part, shape, dtype)
    }


class SessionBlocks:
    """Blocks read into a session's arrays [layers, kv_heads, tokens, head_dim], whose
    rows of a block lie in 2 * layers * kv_heads pieces: each block is read whole into a
    staging block of the reading thread's, then copied into place."""

    direct: DirectReader | None = None  # staged, then copied: read by views

    def __init__(self, k: np.ndarray, v: np.ndarray, block_size: int) -> None:
        self.k, self.v, self.block_size = k, v, block_size
        self.dtype = k.dtype
        self._staging = threading.local()

    def views(self, i: int) -> list[np.ndarray]:
        buf = getattr(self._staging, "buf", None)
        if buf is None:
            layers, kv_heads, _, row = self.k.shape
            shape = (2, layers, kv_heads, self.block_size, row)
            buf = self._staging.buf = np.empty(shape, self.k.dtype)
        return [buf]

    def place(self, i: int) -> None:
        cols, buf = slice(i * self.block_size, (i + 1) * self.block_size), self._staging.buf
        self.k[:, :, cols], self.v[:, :, cols] = buf[0], buf[1]
