"""The residency index: where every session's KV lives, the one owner of the eviction
decisions. Pure logic, no Redis and no files: `apply` takes an event or a command and returns
the Effects (records, prefix marks, orders for workers, files to delete, counters, replies)
the service carries out in one Redis transaction. Its records are in a SessionTable
(session_table.py); eviction.py chooses the warm and disk budgets' victims. A command
(DeleteSession, ForkSession, Evict) is answered once: at once, or when its event is applied."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from broker.messages import (
    AnswerStatus,
    CommandAnswer,
    CommandOp,
    ControlOrder,
    EventKind,
    GoneReason,
    KVCommand,
    OrderOp,
    SessionEvent,
)
from broker.records import SessionRecord
from common.enums import IN_MEMORY, Tier
from kvstore.disk_usage import FileBlocks
from kvstore.effects import Effects, Order
from kvstore.eviction import disk_victims, warm_victims
from kvstore.session_table import SessionTable

log = logging.getLogger("warmfleet.kvstore")
TOMBSTONE_S = 600.0  # how long late events of a deleted session are ignored
OK = CommandAnswer(AnswerStatus.OK)
NOT_FOUND = CommandAnswer(AnswerStatus.NOT_FOUND)
# file_info(key) -> (size, mtime_ns) of the session's spill file, or None
FileInfo = Callable[[str], "tuple[int, int] | None"]


def gone(last_used: float) -> SessionRecord:
    return SessionRecord(Tier.GONE, "", 0, 0, last_used)


class ResidencyIndex:
    def __init__(
        self, disk_budget: int | None, file_info: FileInfo, file_blocks: FileBlocks | None = None
    ) -> None:
        self.disk_budget = disk_budget  # None: unbounded
        self.file_info = file_info
        self.table = SessionTable(file_blocks)
        self.budgets: dict[str, int] = {}  # warm budget of each live worker
        self.alive: set[str] = set()
        self.pids: dict[str, int] = {}  # each worker's process, as its heartbeat last said
        self.tombstones: dict[str, float] = {}

    # ---- changing -----------------------------------------------------------------

    def load(self, records: dict[str, SessionRecord]) -> None:
        """Start from the records found in Redis."""
        for key, record in records.items():
            self.table.load(key, record)

    def apply(self, item: SessionEvent | KVCommand, now: float | None = None) -> Effects:
        now = time.time() if now is None else now
        fx = Effects()
        if isinstance(item, KVCommand):
            self._command(item, fx, now)
            return fx
        self._apply_event(item, fx)
        if item.reply_to:  # the command it completes is answered with the index updated
            fx.replies.append((item.reply_to, OK))
        return fx

    def set_workers(
        self,
        budgets_by_worker: dict[str, int],
        *,
        ask_returned: bool = True,
        pool_bytes: dict[str, int] | None = None,
        pids: dict[str, int] | None = None,
    ) -> Effects:
        """The live workers and their warm budgets (from their heartbeats): gone workers'
        sessions move to disk or gone; live ones' warm bytes (`pool_bytes` until events count
        them) kept within budget. With `ask_returned`, one live again reports: it may hold
        what was taken for lost (not a known worker's new process (`pids`): it reported)."""
        fx = Effects()
        for worker, nbytes in (pool_bytes or {}).items():
            self.table.warm_held.setdefault(worker, nbytes)
        back = sorted(set(budgets_by_worker) - self.alive) if ask_returned else []
        for worker in (w for w in back if self.pids.get(w, -1) in (-1, (pids or {}).get(w))):
            fx.orders.append(Order(worker, ControlOrder(OrderOp.REPORT)))
        self.pids.update(pids or {})
        self.budgets = dict(budgets_by_worker)
        self.alive = set(budgets_by_worker)
        for worker in self.table.workers():
            if worker not in self.alive:
                self.table.warm_held.pop(worker, None)
                for key in self.table.on_worker(worker):
                    self._lost(key, fx)
        self._enforce_disk_budget(fx)
        for worker in self.alive:
            self._enforce_warm_budget(worker, fx)
        cutoff = time.time() - TOMBSTONE_S
        self.tombstones = {k: t for k, t in self.tombstones.items() if t > cutoff}
        return fx

    def reconcile_disk(self, files: dict[str, tuple[int, int, int]]) -> Effects:
        """Match the index with the spill files found (key -> (size, mtime_ns, tokens)):
        a file no record knows becomes a disk record, a disk record without its file
        becomes gone."""
        fx = Effects()
        for key, record in list(self.table.records.items()):
            if record.tier == Tier.DISK and key not in files:
                self.table.put(fx, key, replace(record, tier=Tier.GONE, nbytes=0, file_mtime_ns=0))
        for key, (size, mtime_ns, tokens) in files.items():
            known = self.table.records.get(key)
            if known is None or known.tier == Tier.GONE:
                last = known.last_used if known else mtime_ns / 1e9
                self.table.put(fx, key, SessionRecord(Tier.DISK, "", tokens, size, last, mtime_ns))
        self._enforce_disk_budget(fx)
        return fx

    # ---- events -------------------------------------------------------------------

    def _apply_event(self, e: SessionEvent, fx: Effects) -> None:
        if e.warm_bytes >= 0:
            self.table.warm_held[e.worker] = e.warm_bytes
        if e.kind == EventKind.INVENTORY:
            self._inventory(e, fx)
        elif e.key in self.tombstones and e.kind != EventKind.HOT:
            if e.kind == EventKind.DISK:  # written just before the delete reached the worker
                fx.unlink.append((e.key, e.file_mtime_ns))
        elif e.kind in (EventKind.HOT, EventKind.WARM):
            self._in_memory(e, fx)
        elif e.kind == EventKind.DISK:
            fx.count("spills")
            self._disk(e, fx)
            # a spilled session frees only the blocks no other session holds
            self._enforce_warm_budget(e.worker, fx)
        elif e.kind == EventKind.GONE:
            self._gone(e, fx)

    def _in_memory(self, e: SessionEvent, fx: Effects) -> None:
        if e.kind == EventKind.HOT:
            self.tombstones.pop(e.key, None)
            fx.marks[e.key] = e.marks  # the session last started on its prompt's prefix
            if e.source == "disk":
                fx.count("restores")
        self._forget_other_copy(e.key, e.worker, fx)
        tier = Tier.HOT if e.kind == EventKind.HOT else Tier.WARM
        self.table.put(
            fx, e.key, SessionRecord(tier, e.worker, e.num_tokens, e.nbytes, e.last_used)
        )
        if tier == Tier.WARM:
            self._enforce_warm_budget(e.worker, fx)

    def _disk(self, e: SessionEvent, fx: Effects) -> None:
        record = self.table.records.get(e.key)
        if record is not None and record.worker not in ("", e.worker):
            # another worker holds a newer copy (or took this file back already): the
            # file, if it is still the one written, is stale
            fx.unlink.append((e.key, e.file_mtime_ns))
            return
        last = record.last_used if record is not None else e.last_used
        self.table.put(
            fx, e.key, SessionRecord(Tier.DISK, "", e.num_tokens, e.nbytes, last, e.file_mtime_ns)
        )
        self._enforce_disk_budget(fx)

    def _gone(self, e: SessionEvent, fx: Effects) -> None:
        if e.reason == GoneReason.REJECTED:
            fx.count("rejected_files")
        elif e.reason == GoneReason.WRITE_FAILED:
            fx.count("failed_writes")
        record = self.table.records.get(e.key)
        # a rejected file was the index's copy (worker ""); other reasons concern the copy
        # this worker held, and say nothing of a file another write left since
        holders = ("", e.worker) if e.reason == GoneReason.REJECTED else (e.worker,)
        if record is None or record.worker not in holders:
            return
        self.table.put(fx, e.key, gone(record.last_used))

    def _inventory(self, e: SessionEvent, fx: Effects) -> None:
        """The worker's whole truth at this point of the stream."""
        held = {h.key: h for h in e.held}
        for key in self.table.on_worker(e.worker):
            if key not in held:
                self._lost(key, fx)
        for h in held.values():
            if h.key in self.tombstones:
                continue
            other = self.table.records.get(h.key)
            if other is not None and other.worker != e.worker and other.tier != Tier.GONE:
                if other.last_used >= h.last_used:  # a newer copy is elsewhere or on disk
                    fx.orders.append(Order(e.worker, ControlOrder(OrderOp.FORGET, h.key)))
                    continue
                if self._elsewhere(other, e.worker):
                    fx.orders.append(Order(other.worker, ControlOrder(OrderOp.FORGET, h.key)))
                elif other.tier == Tier.DISK:
                    fx.unlink.append((h.key, other.file_mtime_ns))
            record = SessionRecord(Tier(h.tier), e.worker, h.num_tokens, h.nbytes, h.last_used)
            self.table.put(fx, h.key, record)
        self._enforce_warm_budget(e.worker, fx)
        self._enforce_disk_budget(fx)

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
        record = self.table.records.get(key)
        if record is not None and self._elsewhere(record, worker):
            fx.orders.append(Order(record.worker, ControlOrder(OrderOp.FORGET, key)))

    def _lost(self, key: str, fx: Effects) -> None:
        """The worker that held `key` no longer does: its file, if any, is what is left."""
        r, info = self.table.records[key], self.file_info(key)
        if info is None:
            self.table.put(fx, key, gone(r.last_used))
            return
        size, mtime_ns = info
        self.table.put(
            fx, key, SessionRecord(Tier.DISK, "", r.num_tokens, size, r.last_used, mtime_ns)
        )

    # ---- commands -----------------------------------------------------------------

    def _command(self, c: KVCommand, fx: Effects, now: float) -> None:
        if c.deadline and now > c.deadline:
            late_s = now - c.deadline
            log.warning("%s %s dropped: its caller gave up %.1f s ago", c.op, c.key, late_s)
            return
        record = self.table.records.get(c.key)
        if record is None:
            fx.replies.append((c.reply_to, NOT_FOUND))
        elif c.op == CommandOp.DELETE:
            self._delete(c, record, fx, now)
        elif c.op == CommandOp.FORK:
            self._fork(c, record, fx, now)
        elif record.tier == Tier.WARM and record.worker in self.alive:  # EVICT
            self._order_spill(c.key, fx)
            fx.replies.append((c.reply_to, CommandAnswer(AnswerStatus.OK, Tier.SPILLING)))
        else:
            fx.replies.append((c.reply_to, CommandAnswer(AnswerStatus.OK, record.tier)))

    def _delete(self, c: KVCommand, record: SessionRecord, fx: Effects, now: float) -> None:
        self.table.remove(fx, c.key)
        self.tombstones[c.key] = now
        if record.worker in self.alive:  # it drops the KV and its file, then answers
            order = ControlOrder(OrderOp.DROP, c.key, reply_to=c.reply_to)
            fx.orders.append(Order(record.worker, order))
        else:
            fx.unlink.append((c.key, 0))
            fx.replies.append((c.reply_to, OK))

    def _fork(self, c: KVCommand, source: SessionRecord, fx: Effects, now: float) -> None:
        if c.new_key in self.table.records:
            fx.replies.append((c.reply_to, CommandAnswer(AnswerStatus.EXISTS)))
            return
        self.tombstones.pop(c.new_key, None)
        order = ControlOrder(OrderOp.FORK, c.key, c.new_key, c.reply_to)
        if source.worker in self.alive:  # the worker copies the KV, then answers
            record = SessionRecord(Tier.WARM, source.worker, source.num_tokens, source.nbytes, now)
            self.table.put(fx, c.new_key, record)
            fx.orders.append(Order(source.worker, order))  # before any spill
            self._enforce_warm_budget(source.worker, fx)
            return
        self.table.put(fx, c.new_key, gone(now))
        if source.tier == Tier.DISK:  # any worker of the host restores it and copies
            fx.orders.append(Order("", order))
        else:
            fx.replies.append((c.reply_to, OK))

    # ---- eviction (the policy: eviction.py) -----------------------------------------

    def _enforce_warm_budget(self, worker: str, fx: Effects) -> None:
        for key in warm_victims(self.table, worker, self.budgets.get(worker)):
            self._order_spill(key, fx)

    def _order_spill(self, key: str, fx: Effects) -> None:
        """Mark the session spilling (no longer warm bytes) and order its worker to write it."""
        record = self.table.records[key]
        self.table.put(fx, key, replace(record, tier=Tier.SPILLING))
        fx.orders.append(Order(record.worker, ControlOrder(OrderOp.SPILL, key)))
        fx.count("evictions_ordered")

    def _enforce_disk_budget(self, fx: Effects) -> None:
        for key in disk_victims(self.table, self.disk_budget):
            record = self.table.records[key]
            fx.unlink.append((key, record.file_mtime_ns))
            fx.count("budget_deletions")
            self.table.put(fx, key, gone(record.last_used))
