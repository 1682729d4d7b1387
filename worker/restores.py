"""Sessions' KV being read back from disk on the spiller's reading thread: each one's file, then,
where the pool takes them in place (a host pool; a file in its KV dtype whose layers hold
every position), the blocks it lists straight into the pool's blocks
(engine/kv/pool_read.py) while the worker goes on stepping."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from broker.messages import EventKind, GoneReason
from engine.kv.kv_pool import PagedKV
from engine.kv.pool_read import PoolRead
from engine.kv_files.spill_file import Listing
from worker.state import WorkerState

log = logging.getLogger("warmfleet.worker")


@dataclass(slots=True)
class Restore:
    """One session's read: its file's, then (`read`) its blocks'."""

    future: Future[Any]  # the file's (SpilledKV | Listing | None, found); then read's
    started: float  # monotonic seconds
    read: PoolRead | None = None


class Restores:
    def __init__(self, state: WorkerState) -> None:
        self.s = state
        self.reading: dict[str, Restore] = {}

    def start(self, key: str) -> bool:
        """Start reading a session back; False if it is not on disk (in the pool, in a
        write in flight, or nowhere)."""
        spiller = self.s.spiller
        if key in self.s.engine.sessions or spiller is None or not spiller.has_file(key):
            return False
        in_place = self.s.engine.pool.host_blocks
        self.reading[key] = Restore(spiller.restore_async(key, in_place), time.monotonic())
        return True

    def finished(self, only: str | None = None) -> list[tuple[str, PagedKV | None, str]]:
        """The sessions whose reads are done (`only`'s, waited for, if given): each one's
        KV in the pool (None: recompute it) and where it was found."""
        done = []
        for key, restore in list(self.reading.items()):
            if (only is not None and key != only) or (only is None and not restore.future.done()):
                continue
            got = self._advance(key, restore, wait=only is not None)
            if got is not None:
                del self.reading[key]
                done.append((key, *got))
        return done

    def _advance(self, key: str, restore: Restore, wait: bool) -> tuple[PagedKV | None, str] | None:
        """A finished read's session in the pool (None: recompute it) and where it was
        found; or None while the blocks of its file, just read, are being read in place
        (`wait`: until they are)."""
        spiller = self.s.spiller
        assert spiller is not None
        engine = self.s.engine
        if restore.read is None:
            kv, found = self._result(key, restore.future, (None, "none"))
            if not isinstance(kv, Listing):
                cache = None if kv is None else engine.with_room(lambda: self.s.load(key, kv))
                if kv is not None and cache is None:
                    found = self._pool_full(key)
                return self._restored(key, restore, cache, found)
            listing = kv
            read = engine.with_room(lambda: PoolRead(engine.pool, listing))
            if read is None:
                spiller.store.delete(key)  # recomputed into memory: not on disk too
                return self._restored(key, restore, None, self._pool_full(key))
            restore.read = read
            restore.future = spiller.read_listed_async(read)
            if not wait and not restore.future.done():
                return None
        got, found = self._result(key, restore.future, (0, "none"))
        if not got:
            restore.read.abandon()
            return self._restored(key, restore, None, found)
        return self._restored(key, restore, restore.read.finish(got), found)

    def _pool_full(self, key: str) -> str:
        """No room in a pool of running sequences only (no idle session left to evict):
        the session is recomputed as they end."""
        blocks = self.s.engine.pool.alloc.num_blocks
        log.warning("KV pool full (%d blocks, all running): recomputing %s", blocks, key)
        return "none"

    @staticmethod
    def _result(key: str, future: Future[Any], failed: tuple[Any, str]) -> Any:
        """A read's result; `failed` where it raised OSError (unreadable for another reason
        than its checks: recomputed)."""
        try:
            return future.result()
        except OSError as e:
            log.warning("could not read back %s (%s); recomputing", key, e)
            return failed

    def _restored(
        self, key: str, restore: Restore, cache: PagedKV | None, found: str
    ) -> tuple[PagedKV | None, str]:
        if found == "rejected":
            report_rejected(self.s, key)
        if cache is not None:
            ms = (time.monotonic() - restore.started) * 1e3
            log.info("read %s back from disk in %.0f ms (%d tokens)", key, ms, cache.offset)
        return cache, found


def report_rejected(state: WorkerState, key: str) -> None:
    """Tell the kvstore that the session's file failed its checks (deleted)."""
    state.outbox.events.append(state.event(EventKind.GONE, key, None, reason=GoneReason.REJECTED))
