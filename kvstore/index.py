"""The residency index: where every session's KV lives. Pure logic, no Redis and no files:
`apply` takes one event or command and returns the Effects (records to write or remove,
orders for workers, files to delete, counters, replies) that the service carries out in
one Redis transaction. The budget policy is in budgets.py, the commands in commands.py.

Warm bytes, the ones a worker's warm budget bounds, are those of warm sessions only: a
victim counts as spilling from the moment it is chosen.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from broker.messages import (
    ControlOrder,
    EventKind,
    GoneReason,
    KVCommand,
    OrderOp,
    SessionEvent,
)
from broker.records import SessionRecord
from common.enums import IN_MEMORY, Tier
from kvstore import budgets, commands
from kvstore.disk_usage import DiskUsage, FileBlocks
from kvstore.effects import Effects, Order

log = logging.getLogger("warmfleet.kvstore")
TOMBSTONE_S = 600.0  # how long late events of a deleted session are ignored
# file_info(key) -> (size, mtime_ns) of the session's spill file, or None
FileInfo = Callable[[str], "tuple[int, int] | None"]


def gone(last_used: float) -> SessionRecord:
    return SessionRecord(Tier.GONE, "", 0, 0, last_used)


class ResidencyIndex:
    @property
    def disk_used(self) -> int:
        """Bytes the spill directory holds for the sessions on disk, shared blocks once."""
        return self.disk.used

    def __init__(
        self, disk_budget: int | None, file_info: FileInfo, file_blocks: FileBlocks | None = None
    ) -> None:
        self.disk_budget = disk_budget  # None: unbounded
        self.file_info = file_info
        self.records: dict[str, SessionRecord] = {}
        self.budgets: dict[str, int] = {}  # warm budget of each live worker
        self.alive: set[str] = set()
        self.tombstones: dict[str, float] = {}
        # what the sessions on disk hold there (shared blocks once)
        self.disk = DiskUsage(file_blocks or (lambda key: None))
        self._by_worker: dict[str, set[str]] = {}
        # each worker's idle sessions' bytes as it counts them (shared blocks once)
        self.warm_held: dict[str, int] = {}

    # ---- reading ------------------------------------------------------------------

    def on_worker(self, worker: str) -> list[str]:
        return sorted(self._by_worker.get(worker, ()))

    def warm_bytes(self, worker: str) -> int:
        """The worker's idle sessions' bytes: as it last counted them (shared blocks once),
        less those of sessions ordered to disk since (each counted whole: at most what its
        spill frees, so the next event corrects a shortfall); the records' sum for a worker
        that does not count them."""
        records = [self.records[k] for k in self.on_worker(worker)]
        held = self.warm_held.get(worker)
        if held is None:
            return sum(r.nbytes for r in records if r.tier == Tier.WARM)
        return max(0, held - sum(r.nbytes for r in records if r.tier == Tier.SPILLING))

    def tier_counts(self) -> dict[str, int]:
        counts = {str(t): 0 for t in Tier}
        for r in self.records.values():
            counts[r.tier] += 1
        return counts

    # ---- changing -----------------------------------------------------------------

    def load(self, records: dict[str, SessionRecord]) -> None:
        """Start from the records found in Redis."""
        for key, record in records.items():
            self._set(key, record)

    def apply(self, item: SessionEvent | KVCommand, now: float | None = None) -> Effects:
        now = time.time() if now is None else now
        fx = Effects()
        if isinstance(item, KVCommand):
            commands.carry_out(self, item, fx, now)
            return fx
        self._apply_event(item, fx)
        if item.reply_to:  # the command it completes is answered with the index updated
            fx.replies.append((item.reply_to, commands.OK))
        return fx

    def set_workers(
        self, budgets_by_worker: dict[str, int], *, ask_returned: bool = True
    ) -> Effects:
        """The live workers and their warm budgets (from their heartbeats): sessions of
        workers that are gone move to disk (when their file exists) or to gone, and every
        live worker's warm bytes are brought within its budget. With `ask_returned`, a
        worker live again (or new) since the last call is ordered to report its inventory:
        what the index took for lost while its heartbeat lapsed, it may still hold."""
        fx = Effects()
        if ask_returned:
            for worker in sorted(set(budgets_by_worker) - self.alive):
                fx.orders.append(Order(worker, ControlOrder(OrderOp.REPORT)))
        self.budgets = dict(budgets_by_worker)
        self.alive = set(budgets_by_worker)
        for worker in list(self._by_worker):
            if worker not in self.alive:
                self.warm_held.pop(worker, None)
                for key in self.on_worker(worker):
                    self._lost(key, fx)
        budgets.enforce_disk_budget(self, fx)
        for worker in self.alive:
            budgets.enforce_warm_budget(self, worker, fx)
        cutoff = time.time() - TOMBSTONE_S
        self.tombstones = {k: t for k, t in self.tombstones.items() if t > cutoff}
        return fx

    def reconcile_disk(self, files: dict[str, tuple[int, int, int]]) -> Effects:
        """Match the index with the spill files found (key -> (size, mtime_ns, tokens)):
        a file no record knows becomes a disk record, a disk record without its file
        becomes gone."""
        fx = Effects()
        for key, record in list(self.records.items()):
            if record.tier == Tier.DISK and key not in files:
                self.put(fx, key, replace(record, tier=Tier.GONE, nbytes=0, file_mtime_ns=0))
        for key, (size, mtime_ns, tokens) in files.items():
            known = self.records.get(key)
            if known is None or known.tier == Tier.GONE:
                last = known.last_used if known else mtime_ns / 1e9
                self.put(fx, key, SessionRecord(Tier.DISK, "", tokens, size, last, mtime_ns))
        budgets.enforce_disk_budget(self, fx)
        return fx

    # ---- events -------------------------------------------------------------------

    def _apply_event(self, e: SessionEvent, fx: Effects) -> None:
        if e.warm_bytes >= 0:
            self.warm_held[e.worker] = e.warm_bytes
        if e.kind == EventKind.INVENTORY:
            self._inventory(e, fx)
        elif e.key in self.tombstones and e.kind != EventKind.HOT:
            if e.kind == EventKind.DISK:  # written just before the delete reached the worker
                fx.unlink.append((e.key, e.file_mtime_ns))
        elif e.kind == EventKind.HOT:
            self.tombstones.pop(e.key, None)
            if e.source == "disk":
                fx.count("restores")
            self._forget_other_copy(e.key, e.worker, fx)
            self.put(fx, e.key, SessionRecord(Tier.HOT, e.worker, e.num_tokens, e.nbytes,
                                              e.last_used))  # fmt: skip
        elif e.kind == EventKind.WARM:
            self._forget_other_copy(e.key, e.worker, fx)
            self.put(fx, e.key, SessionRecord(Tier.WARM, e.worker, e.num_tokens, e.nbytes,
                                              e.last_used))  # fmt: skip
            budgets.enforce_warm_budget(self, e.worker, fx)
        elif e.kind == EventKind.DISK:
            fx.count("spills")
            self._disk(e, fx)
            # a spilled session frees only the blocks no other session holds
            budgets.enforce_warm_budget(self, e.worker, fx)
        elif e.kind == EventKind.GONE:
            self._gone(e, fx)

    def _disk(self, e: SessionEvent, fx: Effects) -> None:
        record = self.records.get(e.key)
        if record is not None and record.worker not in ("", e.worker):
            # another worker holds a newer copy (or took this file back already): the
            # file, if it is still the one written, is stale
            fx.unlink.append((e.key, e.file_mtime_ns))
            return
        last = record.last_used if record is not None else e.last_used
        self.put(fx, e.key, SessionRecord(Tier.DISK, "", e.num_tokens, e.nbytes, last,
                                          e.file_mtime_ns))  # fmt: skip
        budgets.enforce_disk_budget(self, fx)

    def _gone(self, e: SessionEvent, fx: Effects) -> None:
        if e.reason == GoneReason.REJECTED:
            fx.count("rejected_files")
        elif e.reason == GoneReason.WRITE_FAILED:
            fx.count("failed_writes")
        record = self.records.get(e.key)
        # a rejected file was the index's copy (worker ""); other reasons concern the copy
        # this worker held, and say nothing of a file another write left since
        holders = ("", e.worker) if e.reason == GoneReason.REJECTED else (e.worker,)
        if record is None or record.worker not in holders:
            return
        self.put(fx, e.key, gone(record.last_used))

    def _inventory(self, e: SessionEvent, fx: Effects) -> None:
        """The worker's whole truth at this point of the stream."""
        held = {h.key: h for h in e.held}
        for key in self.on_worker(e.worker):
            if key not in held:
                self._lost(key, fx)
        for h in held.values():
            if h.key in self.tombstones:
                continue
            other = self.records.get(h.key)
            if other is not None and other.worker != e.worker and other.tier != Tier.GONE:
                if other.last_used >= h.last_used:  # a newer copy is elsewhere or on disk
                    fx.orders.append(Order(e.worker, ControlOrder(OrderOp.FORGET, h.key)))
                    continue
                if self._elsewhere(other, e.worker):
                    fx.orders.append(Order(other.worker, ControlOrder(OrderOp.FORGET, h.key)))
                elif other.tier == Tier.DISK:
                    fx.unlink.append((h.key, other.file_mtime_ns))
            record = SessionRecord(Tier(h.tier), e.worker, h.num_tokens, h.nbytes, h.last_used)
            self.put(fx, h.key, record)
        budgets.enforce_warm_budget(self, e.worker, fx)
        budgets.enforce_disk_budget(self, fx)

    def _elsewhere(self, record: SessionRecord, worker: str) -> bool:
        """Whether `record` puts the session in the memory of a live worker other than
        `worker`."""
        return (
            record.tier in IN_MEMORY
            and record.worker not in ("", worker)
            and record.worker in self.alive
        )

    def _forget_other_copy(self, key: str, worker: str, fx: Effects) -> None:
        """`worker` has just used the session: a copy another worker holds is older (two
        copies come from requests routed while the index lagged). That one is dropped."""
        record = self.records.get(key)
        if record is not None and self._elsewhere(record, worker):
            fx.orders.append(Order(record.worker, ControlOrder(OrderOp.FORGET, key)))

    def _lost(self, key: str, fx: Effects) -> None:
        """The worker that held `key` no longer does: its file, if any, is what is left."""
        record = self.records[key]
        info = self.file_info(key)
        if info is None:
            self.put(fx, key, gone(record.last_used))
        else:
            size, mtime_ns = info
            self.put(fx, key, SessionRecord(Tier.DISK, "", record.num_tokens, size,
                                            record.last_used, mtime_ns))  # fmt: skip

    # ---- bookkeeping --------------------------------------------------------------

    def put(self, fx: Effects, key: str, record: SessionRecord) -> None:
        self._set(key, record)
        fx.upserts[key] = record
        fx.removals.discard(key)

    def remove(self, fx: Effects, key: str) -> None:
        self._unset(key)
        fx.removals.add(key)
        fx.upserts.pop(key, None)

    def _set(self, key: str, record: SessionRecord) -> None:
        self._unset(key)
        self.records[key] = record
        if record.worker:
            self._by_worker.setdefault(record.worker, set()).add(key)
        if record.tier == Tier.DISK:
            self.disk.add(key, record.nbytes)

    def _unset(self, key: str) -> None:
        old = self.records.pop(key, None)
        if old is None:
            return
        if old.worker:
            keys = self._by_worker.get(old.worker)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_worker[old.worker]
        if old.tier == Tier.DISK:
            self.disk.remove(key)
