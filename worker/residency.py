"""Where this worker's sessions' KV is: in the pool, being written to disk, being read back.
Carries out the kvstore's orders and reports every change as a session event."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any

from broker.leases import Delivery
from broker.messages import ControlOrder, EventKind, GoneReason, Held, OrderOp, SessionEvent
from engine.kv.kv_pool import PagedKV, detach
from engine.kv_files.spill_file import SpilledKV
from worker.restores import Restores, report_rejected
from worker.shared_prefix import SharedPrefixes
from worker.state import WorkerState, cache_key

log = logging.getLogger("warmfleet.worker")
RESTORE_POLL_S = 0.02  # an idle worker's wait for a restore before it looks at Redis again


@dataclass(frozen=True, slots=True)
class Ready:
    """A held request whose session's read is done: admit it on `cache` (if any)."""

    delivery: Delivery
    key: str
    kv_from: str
    cache: PagedKV | None


class Residency:
    def __init__(self, state: WorkerState) -> None:
        self.s = state
        self.restores = Restores(state)
        self.held: list[Delivery] = []  # waiting for their session's (or prefix's) read
        self.shared = SharedPrefixes(state)
        self.last_used: dict[str, float] = {}  # when each pooled session's last request ended
        # sessions dropped while a request used them: whether they were deleted
        self._drop_at_finish: dict[str, bool] = {}
        self._orders: dict[OrderOp, Callable[[ControlOrder], None]] = {
            OrderOp.SPILL: lambda o: self.spill(o.key),
            OrderOp.DROP: lambda o: self.drop(o.key, o.reply_to),
            OrderOp.FORK: lambda o: self.fork(o.key, o.new_key, o.reply_to),
            OrderOp.FORGET: lambda o: self.forget(o.key),
            OrderOp.REPORT: lambda o: self.s.outbox.events.append(self.inventory()),
            OrderOp.SHARE: self.shared.write_for,
        }

    def carry_out(self, order: ControlOrder) -> None:
        """A kvstore order (a read in flight for its session finishes first)."""
        if order.key in self.restores.reading:
            self.finish_restores(only=order.key)
        self._orders[order.op](order)

    def close(self) -> None:
        """At exit: the spill directory's workers/ no longer names this one; writes end."""
        self.shared.close()
        if self.s.spiller is not None:
            self.s.spiller.close()

    # ---- reading back ------------------------------------------------------------------

    def hold_for_restore(self, d: Delivery, key: str) -> bool:
        """Hold `d` while its session's KV is read back from disk; False if it is not on
        disk (in the pool, in a write in flight, or nowhere)."""
        if key not in self.restores.reading and not self.restores.start(key):
            return False
        self.held.append(d)
        return True

    def hold_for_prefix(self, d: Delivery, key: str) -> bool:
        """Hold `d` (a new session's) while its prompt's prefix, held by another worker of
        the host (written on its asking) or only on disk, is read back
        (worker/shared_prefix.py); False if not."""
        if self.shared.hold(d, key):
            self.held.append(d)
            return True
        return False

    def drop_held(self) -> None:
        """Forget the held requests (Redis no longer knows them)."""
        self.held.clear()
        self.shared.waiting.clear()

    @property
    def reading(self) -> bool:
        """Whether requests wait for reads (a session's, or a shared prefix's)."""
        return bool(self.restores.reading or self.shared.waiting)

    def wait_a_little(self) -> None:
        """Nothing to step: give the reads in flight a moment instead of spinning."""
        reads: list[Future[Any]] = [r.future for r in self.restores.reading.values()]
        reads += self.shared.reads()
        if reads:
            wait(reads, RESTORE_POLL_S, FIRST_COMPLETED)
        elif self.shared.waiting:
            time.sleep(RESTORE_POLL_S)  # for the holder's blocks to reach the disk

    def finish_restores(self, only: str | None = None) -> list[Ready]:
        """The held requests whose reads are done (waiting for `only`'s read if given)."""
        ready = []
        for key, cache, found in self.restores.finished(only):
            held = [d for d in self.held if cache_key(d) == key]
            self.held = [d for d in self.held if cache_key(d) != key]
            if not held and cache is not None:  # its requests were dropped meanwhile
                self.s.engine.adopt_session(key, cache)
            for i, d in enumerate(held):  # the first one runs on the KV read back
                ready.append(Ready(d, key, found if i == 0 else "pool", cache if i == 0 else None))
        if only is None:
            for d, key, cache in self.shared.ready():
                self.held.remove(d)
                ready.append(Ready(d, key, "shared" if cache is not None else "", cache))
        return ready

    def bring_back(self, key: str) -> tuple[str, PagedKV | None]:
        """Where this worker finds the session's KV: ("pool", None) when it is in the pool,
        else the KV taken back from a write in flight or from its file, and where it was."""
        if key in self.s.engine.sessions:
            return "pool", None
        if self.s.spiller is None:
            return "none", None
        kv, found = self.s.spiller.take_back(key)
        if found == "rejected":
            report_rejected(self.s, key)
        return found, self.s.load(key, kv) if kv is not None else None

    # ---- orders --------------------------------------------------------------------

    def spill(self, key: str) -> None:
        """Write an idle session to disk (a running one stays)."""
        cache = self.s.engine.sessions.take(key)
        spiller = self.s.spiller
        if cache is not None:
            self.evict(key, cache)
        elif not (self.s.running(key) or (spiller is not None and spiller.is_writing(key))):
            # not here at all (its write, if any, was reported or will be)
            self.s.outbox.events.append(
                self.s.event(EventKind.GONE, key, None, reason=GoneReason.DROPPED)
            )

    def evict(self, key: str, cache: PagedKV) -> None:
        """Out of memory: to disk, or forgotten without a spill directory (its blocks go
        back to the pool either way)."""
        if self.s.spiller is None:
            cache.release()
            self._evicted(key, None)
        else:
            self._evicted(key, detach(cache))

    def _evicted(self, key: str, kv: SpilledKV | None) -> None:
        """A session's KV copied out of the pool: to disk, or forgotten."""
        self.last_used.pop(key, None)
        if self.s.spiller is not None and kv is not None:
            self.s.spiller.spill(key, kv)  # reported when the write is done
        else:
            self.s.outbox.events.append(
                self.s.event(EventKind.GONE, key, None, reason=GoneReason.DROPPED)
            )

    def drop(self, key: str, reply_to: str) -> None:
        """DeleteSession: forget the KV here and on disk; the event answers the command."""
        self.forget(key, deleted=True)
        if self.s.spiller is not None:  # its blocks the pool kept when it went to disk
            hashes = self.s.spiller.drop(key)
            for alloc in self.s.engine.pool.allocs:
                alloc.forget_unheld(hashes)
        self.s.outbox.events.append(
            self.s.event(EventKind.GONE, key, None, reason=GoneReason.DROPPED, reply_to=reply_to)
        )

    def forget(self, key: str, deleted: bool = False) -> None:
        """Drop the session's KV from memory (a running request keeps using it and drops it
        when it ends); `deleted` (DeleteSession): its blocks that nothing else holds are
        no longer found by a later prompt."""
        self._release(key, deleted)
        self.last_used.pop(key, None)
        if self.s.running(key):
            self._drop_at_finish[key] = deleted

    def fork(self, key: str, new_key: str, reply_to: str) -> None:
        """Copy a session's KV (from the pool, or back from disk) under a new key; the new
        session's event answers the command."""
        engine = self.s.engine
        found, back = self.bring_back(key)
        if back is not None:
            engine.adopt_session(key, back)
        if found == "disk":
            self.s.outbox.events.append(
                self.s.event(EventKind.WARM, key, engine.sessions.peek(key))
            )
        cache = engine.sessions.peek(key)
        if cache is None:  # running or gone: the new session recomputes what it needs
            event = self.s.event(EventKind.GONE, new_key, None, reason=GoneReason.DROPPED,
                                 reply_to=reply_to)  # fmt: skip
        else:
            copy = cache.fork()  # the same blocks, copied when either one writes
            engine.adopt_session(new_key, copy)
            self.last_used[new_key] = time.time()
            event = self.s.event(EventKind.WARM, new_key, copy, reply_to=reply_to)
        self.s.outbox.events.append(event)

    # ---- reports -------------------------------------------------------------------

    def session_ended(self, key: str) -> None:
        """A request of `key` ended: its KV is idle in the pool now (or deleted)."""
        if key in self._drop_at_finish:
            self._release(key, self._drop_at_finish.pop(key))
            return
        self.last_used[key] = time.time()
        self.s.outbox.events.append(
            self.s.event(EventKind.WARM, key, self.s.engine.sessions.peek(key))
        )

    def _release(self, key: str, deleted: bool = False) -> None:
        cache = self.s.engine.sessions.take(key)
        if cache is not None:
            cache.release(forget=deleted)

    def inventory(self) -> SessionEvent:
        now = time.time()
        pooled = self.s.engine.sessions.items()
        self.last_used = {k: self.last_used.get(k, now) for k, _ in pooled}
        held = [Held(k, "warm", c.offset, c.nbytes, self.last_used[k]) for k, c in pooled]
        held += [
            Held(f.cache_key, "hot", 0, 0, now) for f in self.s.inflight.values() if f.cache_key
        ]
        return SessionEvent(EventKind.INVENTORY, self.s.config.worker_id, last_used=now,
                            held=tuple(held), warm_bytes=self.s.engine.sessions.nbytes)  # fmt: skip

    def flush(self, kvstore_alive: bool) -> None:
        """Evict what the pool pushed out, and report the writes that finished."""
        engine = self.s.engine
        if engine.evicted_sessions:
            pool = engine.sessions
            why = (
                "past its ceiling though the kvstore runs (its spill orders fell behind)"
                if kvstore_alive
                else "over the warm budget and no kvstore is running to order spills"
            )
            log.warning(
                "evicting %d session(s) by the worker's own LRU: the pool (%d bytes without "
                "them) was %s; limit %d bytes", len(engine.evicted_sessions), pool.nbytes, why,
                pool.budget_bytes,
            )  # fmt: skip
        for key, kv in engine.evicted_sessions:
            self._evicted(key, kv)
        engine.evicted_sessions.clear()
        if self.s.spiller is None:
            return
        for done in self.s.spiller.completed():
            if done.file is None:
                event = self.s.event(EventKind.GONE, done.key, None, reason=GoneReason.WRITE_FAILED)
            else:
                f = done.file
                event = SessionEvent(
                    EventKind.DISK, self.s.config.worker_id, done.key, f.num_tokens, f.size,
                    time.time(), file_mtime_ns=f.mtime_ns, warm_bytes=self.s.engine.sessions.nbytes,
                )  # fmt: skip
            self.s.outbox.events.append(event)
