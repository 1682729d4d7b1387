"""The residency records in memory, and what the index asks of them often: each worker's
sessions, each worker's idle bytes as it counts them, and the bytes the spill directory holds
for the sessions on disk (shared blocks once). Bookkeeping only: the rules are the index's
(index.py), which alone changes the table.

Warm bytes, the ones a worker's warm budget bounds, are those of warm sessions only: a
victim counts as spilling from the moment it is chosen.
"""

from __future__ import annotations

from broker.records import SessionRecord
from common.enums import Tier
from kvstore.disk_usage import DiskUsage, FileBlocks
from kvstore.effects import Effects


class SessionTable:
    def __init__(self, file_blocks: FileBlocks | None = None) -> None:
        self.records: dict[str, SessionRecord] = {}
        # what the sessions on disk hold there (shared blocks once)
        self.disk = DiskUsage(file_blocks or (lambda key: None))
        # each worker's idle sessions' bytes as it counts them (shared blocks once)
        self.warm_held: dict[str, int] = {}
        self._by_worker: dict[str, set[str]] = {}

    # ---- reading ------------------------------------------------------------------

    def workers(self) -> list[str]:
        """The workers some record names."""
        return sorted(self._by_worker)

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

    def least_recent(self, tier: Tier, worker: str | None = None) -> list[str]:
        """The sessions in `tier` (of `worker` only, if given), least recently used first."""
        keys = self.records if worker is None else self.on_worker(worker)
        found = [(self.records[k].last_used, k) for k in keys if self.records[k].tier == tier]
        return [k for _, k in sorted(found)]

    def tier_counts(self) -> dict[str, int]:
        counts = {str(t): 0 for t in Tier}
        for r in self.records.values():
            counts[r.tier] += 1
        return counts

    # ---- changing -----------------------------------------------------------------

    def put(self, fx: Effects, key: str, record: SessionRecord) -> None:
        """Set the session's record, and have it written."""
        self.load(key, record)
        fx.upserts[key] = record
        fx.removals.discard(key)

    def remove(self, fx: Effects, key: str) -> None:
        """Drop the session's record, and have it deleted."""
        self._unset(key)
        fx.removals.add(key)
        fx.upserts.pop(key, None)

    def load(self, key: str, record: SessionRecord) -> None:
        """Set the session's record as Redis holds it already."""
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
