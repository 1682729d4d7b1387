"""The spill directory's files as the kvstore reads them: each session's file and the
blocks it lists, and a sweep that deletes the block files no session's file lists (and the
shared-prefix answers no worker took)."""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from engine.kv_files.block_file import block_path, sweep
from engine.kv_files.spill_file import ANSWERS_DIR, BLOCKS_DIR, read_summary, spill_path

log = logging.getLogger("warmfleet.kvstore")
SWEEP_S = 30.0  # how often the directory is swept
ANSWER_GRACE_S = 120.0  # an answer is read within seconds; older ones were given up on


class DiskSweep:
    def __init__(self, spill_dir: Path, every_s: float = SWEEP_S) -> None:
        self.spill_dir = spill_dir
        self.blocks = spill_dir / BLOCKS_DIR
        self.every_s = every_s
        self._next = 0.0
        self._orphans: set[str] = set()  # blocks of deleted files: no grace for them

    def due(self) -> bool:
        return time.monotonic() >= self._next

    def soon(self, blocks: tuple[str, ...]) -> None:
        """A spill file listing `blocks` was deleted: sweep at the next pass, and delete
        those of its blocks no other file lists at once."""
        self._orphans.update(blocks)
        self._next = 0.0

    def block_size(self, h: str) -> int:
        """Bytes of one block file (0 if it is gone)."""
        try:
            return block_path(self.blocks, bytes.fromhex(h)).stat().st_size
        except (FileNotFoundError, ValueError):
            return 0

    def scan(self) -> tuple[dict[str, tuple[int, int, int]], int]:
        """Spill files by session key: (size of its own file, mtime_ns, tokens); and how
        many files were unreadable (deleted)."""
        files = {}
        rejected = 0
        for path in self.spill_dir.glob("*.wfkv"):
            summary = read_summary(path)
            if summary is None or spill_path(self.spill_dir, summary.key) != path:
                log.warning("deleting %s: not a readable spill file of this version", path.name)
                path.unlink(missing_ok=True)
                rejected += 1
                continue
            files[summary.key] = (summary.size, summary.mtime_ns, summary.num_tokens)
        return files, rejected

    def file_blocks(self, key: str) -> tuple[int, dict[str, int]] | None:
        """The bytes of a session's own file and of each block it lists; None without a
        readable file."""
        path = spill_path(self.spill_dir, key)
        summary = read_summary(path)
        if summary is None:
            return None
        return summary.size, {h: self.block_size(h) for h in summary.blocks}

    def run(self) -> None:
        """Delete the unlisted blocks (except those a write in flight may be about to
        list)."""
        self._next = time.monotonic() + self.every_s
        listed: set[str] = set()
        for path in self.spill_dir.glob("*.wfkv"):
            summary = read_summary(path)
            if summary is not None:
                listed.update(summary.blocks)
        freed = 0
        for h in self._orphans - listed:
            freed += self.block_size(h)
            block_path(self.blocks, bytes.fromhex(h)).unlink(missing_ok=True)
        self._orphans.clear()
        if self.blocks.is_dir():
            freed += sweep(self.blocks, listed)
        if freed:
            log.info("deleted %d bytes of blocks no session lists", freed)
        self._sweep_answers()

    def _sweep_answers(self) -> None:
        """Delete the shared-prefix answers older than ANSWER_GRACE_S (their asker gave up
        waiting before the holder answered)."""
        cutoff = time.time() - ANSWER_GRACE_S
        for path in (self.spill_dir / ANSWERS_DIR).glob("*"):
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
