"""Moves evicted sessions' KV to disk on a writing thread, and brings it back on resume on a
reading thread."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from common.errors import SpillFileError
from common.priority import lower_thread_priority
from engine.kv.pool_read import PoolRead
from engine.kv_files.spill_file import FileSummary, Listing, SpilledKV, SpillStore
from engine.model import Model

log = logging.getLogger("warmfleet.worker")
WRITE_NICE = 10  # the writing thread's nice value (_background_priority)
RECLAIM_WAIT_S = 30.0  # longest wait for a write in flight when its session comes back


@dataclass(frozen=True, slots=True)
class SpillResult:
    key: str
    file: FileSummary | None  # None: the write failed
    error: str = ""


@dataclass(slots=True)
class SpillStats:
    num_spilled: int = 0
    num_restored: int = 0
    num_rejected: int = 0  # files that failed a check: deleted, session recomputed
    num_failed: int = 0  # writes that failed (e.g. disk full): session recomputed later
    num_converted: int = 0  # files read back from another KV dtype (spill_file.CONVERTIBLE)
    num_shared: int = 0  # prefixes written for another worker of the host (SHARE orders)
    num_shared_read: int = 0  # prefixes another worker held, read from its block files


class Spiller:
    """The one rule: a session's KV is in memory or in its file, never both for long. A
    file is deleted as soon as its session is back in memory."""

    def __init__(self, store: SpillStore, model: Model) -> None:
        self.store = store
        self.model = model
        self.stats = SpillStats()
        # writes on one thread, reads on another: a session coming back (often the reason
        # another goes to disk) does not wait for that one's write. A session is read only
        # once no write of its own is in flight (has_file; take_back takes the bytes back).
        self._io = ThreadPoolExecutor(1, "spill", initializer=_background_priority)
        self._reads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="restore")
        # another worker's request waits on a share: not behind this worker's spills, and
        # not at their lower priority
        self._shares = ThreadPoolExecutor(max_workers=1, thread_name_prefix="share")
        self._pending: dict[str, tuple[SpilledKV, Future[FileSummary]]] = {}

    def spill(self, key: str, kv: SpilledKV) -> None:
        """Write a session's KV (copied out of the pool) in the background."""
        self._pending[key] = (kv, self._io.submit(self.store.write, key, kv))

    def is_writing(self, key: str) -> bool:
        return key in self._pending

    def completed(self) -> list[SpillResult]:
        """The writes that finished since the last call."""
        done = []
        for key, (_, future) in list(self._pending.items()):
            if not future.done():
                continue
            del self._pending[key]
            try:
                done.append(SpillResult(key, future.result()))
            except OSError as e:
                self.stats.num_failed += 1
                log.warning("could not spill %s (%s); it will be recomputed", key, e)
                done.append(SpillResult(key, None, str(e)))
                continue
            except Exception as e:  # a bug in the writer must not take the worker down
                self.stats.num_failed += 1
                log.exception("spilling %s failed; it will be recomputed", key)
                done.append(SpillResult(key, None, repr(e)))
                continue
            self.stats.num_spilled += 1
        return done

    def take_back(self, key: str) -> tuple[SpilledKV | None, str]:
        """The session's KV back in memory, and where it was: (kv, "pending") when its
        write was still in flight, (kv, "disk"), (None, "rejected") when its file failed a
        check (deleted), or (None, "none")."""
        pending = self._pending.pop(key, None)
        if pending is not None:  # evicted moments ago: the bytes are still here
            kv, future = pending
            future.exception(timeout=RECLAIM_WAIT_S)
            self.store.delete(key)
            return kv, "pending"
        return self._read_back(key)

    def has_file(self, key: str) -> bool:
        """Whether the session is on disk only (not in a write still in flight)."""
        return key not in self._pending and self.store.path_for(key).exists()

    def restore_async(
        self, key: str, listing: bool = False
    ) -> Future[tuple[SpilledKV | Listing | None, str]]:
        """take_back of a session on disk, on the reading thread (decoding goes on meanwhile);
        with `listing`, a file whose blocks can go straight into the pool comes back as a
        Listing (the file stays until read_listed_async has read them)."""
        return self._reads.submit(self._list_back, key, listing)

    def read_listed_async(self, read: PoolRead) -> Future[tuple[int, str]]:
        """The blocks of a Listing restore_async gave read into the pool, on the reading
        thread: how many of its tokens came back, and "disk" (or 0 and "rejected")."""
        return self._reads.submit(self._read_listed, read)

    def _read_listed(self, read: PoolRead) -> tuple[int, str]:
        key = read.listing.key
        got, why = self.store.read_listed(read.listing, read, read.first)
        self.store.delete(key)
        return (got, "disk") if self._count_read(key, got, why) else (0, "rejected")

    def _count_read(self, key: str, tokens: int, why: str) -> bool:
        """Count a session read back (`why`: why only `tokens` came back, if so); False
        when none did."""
        if why:
            self.stats.num_rejected += 1
            log.warning("%s: only %d tokens read back, recomputing the rest: %s", key, tokens, why)
            if not tokens:
                return False
        self.stats.num_restored += 1
        return True

    def _read_back(self, key: str) -> tuple[SpilledKV | None, str]:
        kv, found = self._list_back(key, listing=False)
        assert not isinstance(kv, Listing)
        return kv, found

    def _list_back(self, key: str, listing: bool) -> tuple[SpilledKV | Listing | None, str]:
        shape, dtype = self._shape(), self.model.kv_dtype
        try:
            if listing:
                kv = self.store.read_listing(key, like=shape, dtype=dtype)
                if isinstance(kv, Listing):
                    return kv, "disk"
            else:
                kv = self.store.read(key, like=shape, dtype=dtype)
        except SpillFileError as e:
            self.stats.num_rejected += 1
            log.warning("rejected spill file, recomputing %s: %s", key, e.reason)
            return None, "rejected"
        if kv is None:
            return None, "none"
        self.store.delete(key)
        if kv.converted_from:
            self.stats.num_converted += 1
            log.info("%s: KV read back from %s into %s", key, kv.converted_from, kv.k.dtype)
        if not self._count_read(key, len(kv.token_ids), kv.incomplete):
            return None, "rejected"
        return kv, "disk"

    def share(self, kv: SpilledKV | None, answer: Path) -> None:
        """Write a prefix's block files for another worker of the host (those there already
        are only touched), then `answer`, in the background: on a thread of its own at the
        process's priority, since the asking worker waits only about what prefilling the
        prefix would take it (a write queued behind spills at nice 10 on a busy host came
        too late)."""
        self._shares.submit(self._share, kv, answer)

    def _share(self, kv: SpilledKV | None, answer: Path) -> None:
        try:
            if kv is not None:
                hashes, added = self.store.write_blocks(kv)
                self.stats.num_shared += 1
                log.info("wrote a shared prefix of %d blocks (%d bytes new)", len(hashes), added)
        except OSError as e:
            log.warning("could not write a shared prefix's blocks (%s)", e)
        try:
            answer.touch()
        except OSError as e:  # the asking worker waits out its deadline
            log.warning("could not answer a shared prefix's request (%s)", e)

    def read_prefix_async(self, scope: str, ids: list[int]) -> Future[SpilledKV]:
        """The longest run of `ids`'s whole blocks on disk, read on the reading thread."""
        read = self.store.read_prefix
        return self._reads.submit(read, scope, ids, like=self._shape(), dtype=self.model.kv_dtype)

    def read_prefix_into_async(self, read: PoolRead) -> Future[int]:
        """The blocks of a prefix's Listing (SpillStore.prefix_listing) read into the pool,
        on the reading thread: how many of its tokens (a missing or bad block ends them)."""
        listing = read.listing
        return self._reads.submit(
            lambda: self.store.read_listed(listing, read, read.first, counted=False)[0]
        )

    def prefix_listing(self, scope: str, ids: list[int]) -> Listing:
        return self.store.prefix_listing(scope, ids, like=self._shape(), dtype=self.model.kv_dtype)

    def drop(self, key: str) -> list[bytes]:
        """Forget the session everywhere (DeleteSession); the hashes of its file's whole
        blocks (which the pool may still know: those it listed, and a windowed model's that
        its windowed layers released)."""
        pending = self._pending.pop(key, None)
        if pending is not None:
            pending[1].exception(timeout=RECLAIM_WAIT_S)
        hashes = self.store.token_hashes(key)
        self.store.delete(key)
        return hashes

    def close(self) -> None:
        self._io.shutdown(wait=True)
        self._reads.shutdown(wait=True)
        self._shares.shutdown(wait=True)

    def _shape(self) -> tuple[int, int, int]:
        c = self.model.config
        return c.num_layers, c.num_kv_heads, c.head_dim


def _background_priority() -> None:
    """Lower the writing thread's CPU priority (nice + WRITE_NICE): its hashing and copies
    wait for the decoding threads, whose steps it would otherwise stretch where they take
    every core. On 2 cores, a float32 session's disk resume that pushed another out (whose
    write ran meanwhile): its time to first token past the read 51 ms with the writer at
    nice 0, 31 ms at 10 (means of 6; bench/RESULTS.md)."""
    lower_thread_priority(WRITE_NICE)
