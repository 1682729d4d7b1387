"""The residency index: where every session's KV lives, and the eviction decisions.

Pure logic, no Redis and no files: `apply` takes one event or command and returns the
`Effects` (records to write or remove, orders for workers, files to delete, counters,
replies) that the service carries out in one Redis transaction.

Tiers: hot (in a running request), warm (idle in a worker's pool), spilling (ordered to
disk, still in the worker's memory until the write is done), disk, gone. Warm bytes, the
ones a worker's warm budget bounds, are those of warm sessions only: a victim counts as
spilling from the moment it is chosen.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from broker import kv_events as ev
from broker.kv_events import REPLY_EXISTS, REPLY_NOT_FOUND, REPLY_OK, KVCommand, KVEvent

log = logging.getLogger("warmfleet.kvstore")

HOT, WARM, SPILLING, DISK, GONE = "hot", "warm", "spilling", "disk", "gone"
IN_MEMORY = (HOT, WARM, SPILLING)
TOMBSTONE_S = 600.0  # how long late events of a deleted session are ignored


# file_info(key) -> (size, mtime_ns) of the session's spill file, or None
FileInfo = Callable[[str], "tuple[int, int] | None"]


@dataclass(slots=True)
class Record:
    tier: str
    worker: str  # "" unless the KV is in a worker's memory
    num_tokens: int
    nbytes: int  # in memory, or the file's size on disk
    last_used: float
    file_mtime_ns: int = 0  # disk: recognises the file this record describes

    def to_fields(self) -> dict[str, str]:
        return {
            "tier": self.tier,
            "worker": self.worker,
            "num_tokens": str(self.num_tokens),
            "kv_bytes": str(self.nbytes),
            "last_used": f"{self.last_used:.3f}",
            "file_mtime_ns": str(self.file_mtime_ns),
        }

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> Record:
        return cls(
            f.get("tier", GONE),
            f.get("worker", ""),
            int(f.get("num_tokens", 0)),
            int(f.get("kv_bytes", 0)),
            float(f.get("last_used", 0)),
            int(f.get("file_mtime_ns", 0)),
        )


@dataclass(frozen=True, slots=True)
class Order:
    """A control order for a worker ("" = any worker: the shared stream)."""

    worker: str
    op: str
    args: dict[str, str]


@dataclass(slots=True)
class Effects:
    upserts: dict[str, Record] = field(default_factory=dict)
    removals: set[str] = field(default_factory=set)
    orders: list[Order] = field(default_factory=list)
    unlink: list[tuple[str, int]] = field(default_factory=list)  # (key, mtime_ns; 0 = any)
    counters: dict[str, int] = field(default_factory=dict)
    replies: list[tuple[str, str]] = field(default_factory=list)  # (reply key, answer)

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def merge(self, other: Effects) -> None:
        for key, record in other.upserts.items():
            self.upserts[key] = record
            self.removals.discard(key)
        for key in other.removals:
            self.removals.add(key)
            self.upserts.pop(key, None)
        self.orders += other.orders
        self.unlink += other.unlink
        for name, n in other.counters.items():
            self.count(name, n)
        self.replies += other.replies


class ResidencyIndex:
    def __init__(self, disk_budget: int | None, file_info: FileInfo) -> None:
        self.disk_budget = disk_budget  # None: unbounded
        self.file_info = file_info
        self.records: dict[str, Record] = {}
        self.budgets: dict[str, int] = {}  # warm budget of each live worker
        self.alive: set[str] = set()
        self._by_worker: dict[str, set[str]] = {}
        self._tombstones: dict[str, float] = {}
        self.disk_bytes = 0

    # ---- reading ------------------------------------------------------------------

    def on_worker(self, worker: str) -> list[str]:
        return sorted(self._by_worker.get(worker, ()))

    def warm_bytes(self, worker: str) -> int:
        return sum(
            r.nbytes for k in self._by_worker.get(worker, ()) if (r := self.records[k]).tier == WARM
        )

    def tier_counts(self) -> dict[str, int]:
        counts = dict.fromkeys((HOT, WARM, SPILLING, DISK, GONE), 0)
        for r in self.records.values():
            counts[r.tier] += 1
        return counts

    # ---- changing -----------------------------------------------------------------

    def load(self, records: dict[str, Record]) -> None:
        """Start from the records found in Redis."""
        for key, record in records.items():
            self._set(key, record)

    def apply(self, item: KVEvent | KVCommand, now: float | None = None) -> Effects:
        now = time.time() if now is None else now
        fx = Effects()
        if isinstance(item, KVEvent):
            self._apply_event(item, fx)
            if item.reply_to:  # the command it completes is answered with the index updated
                fx.replies.append((item.reply_to, REPLY_OK))
            return fx
        if isinstance(item, KVCommand):
            if item.deadline and now > item.deadline:
                log.warning("%s %s dropped: its caller gave up %.1f s ago", item.op, item.key,
                            now - item.deadline)  # fmt: skip
                return fx
            handler = {ev.DELETE: self._delete, ev.FORK: self._fork, ev.EVICT: self._evict}.get(
                item.op
            )
            if handler is None:
                log.warning("unknown command %r ignored", item.op)
                fx.replies.append((item.reply_to, f"error: unknown command {item.op!r}"))
            else:
                handler(item, fx, now)
        return fx

    def _apply_event(self, item: KVEvent, fx: Effects) -> None:
        if item.kind == ev.INVENTORY:
            self._inventory(item, fx)
        elif item.key in self._tombstones and item.kind != ev.HOT:
            if item.kind == ev.DISK:  # written just before the delete reached the worker
                fx.unlink.append((item.key, int(item.detail or 0)))
        elif item.kind == ev.HOT:
            self._tombstones.pop(item.key, None)
            if item.detail == "disk":
                fx.count("restores")
            self._forget_other_copy(item.key, item.worker, fx)
            self._put(fx, item.key, Record(HOT, item.worker, *_sizes(item)))
        elif item.kind == ev.WARM:
            self._forget_other_copy(item.key, item.worker, fx)
            self._put(fx, item.key, Record(WARM, item.worker, *_sizes(item)))
            self._enforce_warm_budget(item.worker, fx)
        elif item.kind == ev.DISK:
            fx.count("spills")
            self._disk(item, fx)
        elif item.kind == ev.GONE:
            self._gone(item, fx)
        else:
            log.warning("unknown event %r ignored", item.kind)

    def set_workers(self, budgets: dict[str, int]) -> Effects:
        """The live workers and their warm budgets (from their heartbeats): sessions of
        workers that are gone move to disk (when their file exists) or to gone, and every
        live worker's warm bytes are brought within its budget."""
        fx = Effects()
        self.budgets = dict(budgets)
        self.alive = set(budgets)
        for worker in list(self._by_worker):
            if worker not in self.alive:
                for key in self.on_worker(worker):
                    self._lost(key, fx)
        self._enforce_disk_budget(fx)
        for worker in self.alive:
            self._enforce_warm_budget(worker, fx)
        cutoff = time.time() - TOMBSTONE_S
        self._tombstones = {k: t for k, t in self._tombstones.items() if t > cutoff}
        return fx

    def reconcile_disk(self, files: dict[str, tuple[int, int, int]]) -> Effects:
        """Match the index with the spill files found (key -> (size, mtime_ns, tokens)):
        a file no record knows becomes a disk record, a disk record without its file
        becomes gone."""
        fx = Effects()
        for key, record in list(self.records.items()):
            if record.tier == DISK and key not in files:
                self._put(fx, key, replace(record, tier=GONE, nbytes=0, file_mtime_ns=0))
        for key, (size, mtime_ns, tokens) in files.items():
            known = self.records.get(key)
            if known is None or known.tier == GONE:
                last = known.last_used if known else mtime_ns / 1e9
                self._put(fx, key, Record(DISK, "", tokens, size, last, mtime_ns))
        self._enforce_disk_budget(fx)
        return fx

    # ---- events -------------------------------------------------------------------

    def _disk(self, e: KVEvent, fx: Effects) -> None:
        record = self.records.get(e.key)
        if record is not None and record.worker not in ("", e.worker):
            # another worker holds a newer copy (or took this file back already): the
            # file, if it is still the one written, is stale
            fx.unlink.append((e.key, int(e.detail or 0)))
            return
        last = record.last_used if record is not None else e.last_used
        self._put(fx, e.key, Record(DISK, "", e.num_tokens, e.nbytes, last, int(e.detail or 0)))
        self._enforce_disk_budget(fx)

    def _gone(self, e: KVEvent, fx: Effects) -> None:
        if e.detail == ev.REJECTED:
            fx.count("rejected_files")
        elif e.detail == ev.WRITE_FAILED:
            fx.count("failed_writes")
        record = self.records.get(e.key)
        # a rejected file was the index's copy (worker ""); other reasons concern the copy
        # this worker held, and say nothing of a file another write left since
        holders = ("", e.worker) if e.detail == ev.REJECTED else (e.worker,)
        if record is None or record.worker not in holders:
            return
        self._put(fx, e.key, Record(GONE, "", 0, 0, record.last_used))

    def _inventory(self, e: KVEvent, fx: Effects) -> None:
        """The worker's whole truth at this point of the stream."""
        held = {h.key: h for h in ev.parse_inventory(e)}
        for key in self.on_worker(e.worker):
            if key not in held:
                self._lost(key, fx)
        for h in held.values():
            if h.key in self._tombstones:
                continue
            other = self.records.get(h.key)
            if other is not None and other.worker != e.worker and other.tier != GONE:
                if other.last_used >= h.last_used:  # a newer copy is elsewhere or on disk
                    fx.orders.append(Order(e.worker, "forget_session", {"key": h.key}))
                    continue
                if self._elsewhere(other, e.worker):
                    fx.orders.append(Order(other.worker, "forget_session", {"key": h.key}))
                elif other.tier == DISK:
                    fx.unlink.append((h.key, other.file_mtime_ns))
            self._put(fx, h.key, Record(h.tier, e.worker, h.num_tokens, h.nbytes, h.last_used))
        self._enforce_warm_budget(e.worker, fx)
        self._enforce_disk_budget(fx)

    def _elsewhere(self, record: Record, worker: str) -> bool:
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
            fx.orders.append(Order(record.worker, "forget_session", {"key": key}))

    def _lost(self, key: str, fx: Effects) -> None:
        """The worker that held `key` no longer does: its file, if any, is what is left."""
        record = self.records[key]
        info = self.file_info(key)
        if info is None:
            self._put(fx, key, Record(GONE, "", 0, 0, record.last_used))
        else:
            size, mtime_ns = info
            self._put(
                fx, key, Record(DISK, "", record.num_tokens, size, record.last_used, mtime_ns)
            )

    # ---- commands -----------------------------------------------------------------

    def _delete(self, c: KVCommand, fx: Effects, now: float) -> None:
        record = self.records.get(c.key)
        if record is None:
            fx.replies.append((c.reply_to, REPLY_NOT_FOUND))
            return
        self._remove(fx, c.key)
        self._tombstones[c.key] = now
        if record.worker in self.alive:  # it drops the KV and its file, then answers
            fx.orders.append(Order(record.worker, "drop_session", {"key": c.key, "r": c.reply_to}))
        else:
            fx.unlink.append((c.key, 0))
            fx.replies.append((c.reply_to, REPLY_OK))

    def _fork(self, c: KVCommand, fx: Effects, now: float) -> None:
        source = self.records.get(c.key)
        if source is None:
            fx.replies.append((c.reply_to, REPLY_NOT_FOUND))
            return
        if c.new_key in self.records:
            fx.replies.append((c.reply_to, REPLY_EXISTS))
            return
        self._tombstones.pop(c.new_key, None)
        args = {"key": c.key, "new_key": c.new_key, "r": c.reply_to}
        if source.worker in self.alive:  # the worker copies the KV, then answers
            record = Record(WARM, source.worker, source.num_tokens, source.nbytes, now)
            self._put(fx, c.new_key, record)
            fx.orders.append(Order(source.worker, "fork_session", args))  # before any spill
            self._enforce_warm_budget(source.worker, fx)
        elif source.tier == DISK:  # any worker of the host restores it and copies
            self._put(fx, c.new_key, Record(GONE, "", 0, 0, now))
            fx.orders.append(Order("", "fork_session", args))
        else:
            self._put(fx, c.new_key, Record(GONE, "", 0, 0, now))
            fx.replies.append((c.reply_to, REPLY_OK))

    def _evict(self, c: KVCommand, fx: Effects, now: float) -> None:
        record = self.records.get(c.key)
        if record is None:
            fx.replies.append((c.reply_to, REPLY_NOT_FOUND))
            return
        if record.tier == WARM and record.worker in self.alive:
            self._order_spill(c.key, fx)
            fx.replies.append((c.reply_to, SPILLING))
        else:
            fx.replies.append((c.reply_to, record.tier))

    # ---- budgets ------------------------------------------------------------------

    def _enforce_warm_budget(self, worker: str, fx: Effects) -> None:
        budget = self.budgets.get(worker)
        if budget is None:
            return
        warm = sorted(
            (r.last_used, k)
            for k in self._by_worker.get(worker, ())
            if (r := self.records[k]).tier == WARM
        )
        total = sum(self.records[k].nbytes for _, k in warm)
        for _, key in warm:
            if total <= budget:
                break
            total -= self.records[key].nbytes
            self._order_spill(key, fx)

    def _order_spill(self, key: str, fx: Effects) -> None:
        record = self.records[key]
        self._put(fx, key, replace(record, tier=SPILLING))
        fx.orders.append(Order(record.worker, "spill_session", {"key": key}))
        fx.count("evictions_ordered")

    def _enforce_disk_budget(self, fx: Effects) -> None:
        if self.disk_budget is None or self.disk_bytes <= self.disk_budget:
            return
        on_disk = sorted((r.last_used, k) for k, r in self.records.items() if r.tier == DISK)
        for _, key in on_disk:
            if self.disk_bytes <= self.disk_budget:
                break
            record = self.records[key]
            fx.unlink.append((key, record.file_mtime_ns))
            fx.count("budget_deletions")
            self._put(fx, key, Record(GONE, "", 0, 0, record.last_used))

    # ---- bookkeeping --------------------------------------------------------------

    def _put(self, fx: Effects, key: str, record: Record) -> None:
        self._set(key, record)
        fx.upserts[key] = record
        fx.removals.discard(key)

    def _remove(self, fx: Effects, key: str) -> None:
        self._unset(key)
        fx.removals.add(key)
        fx.upserts.pop(key, None)

    def _set(self, key: str, record: Record) -> None:
        self._unset(key)
        self.records[key] = record
        if record.worker:
            self._by_worker.setdefault(record.worker, set()).add(key)
        if record.tier == DISK:
            self.disk_bytes += record.nbytes

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
        if old.tier == DISK:
            self.disk_bytes -= old.nbytes


def _sizes(e: KVEvent) -> tuple[int, int, float]:
    return e.num_tokens, e.nbytes, e.last_used
