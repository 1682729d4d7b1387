"""The eviction policy: each worker's warm bytes within its budget (least recently used idle
sessions ordered to disk), and the spill directory within the disk budget (least recently
used files deleted). A session in a running request is never chosen."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from broker.messages import ControlOrder, OrderOp
from broker.records import SessionRecord
from common.enums import Tier
from kvstore.effects import Effects, Order

if TYPE_CHECKING:
    from kvstore.index import ResidencyIndex


def enforce_warm_budget(index: ResidencyIndex, worker: str, fx: Effects) -> None:
    budget = index.budgets.get(worker)
    if budget is None:
        return
    warm = sorted(
        (r.last_used, k)
        for k in index.on_worker(worker)
        if (r := index.records[k]).tier == Tier.WARM
    )
    total = index.warm_bytes(worker)
    for _, key in warm:
        if total <= budget:
            break
        total -= index.records[key].nbytes
        order_spill(index, key, fx)


def order_spill(index: ResidencyIndex, key: str, fx: Effects) -> None:
    """Mark the session spilling (no longer warm bytes) and order its worker to write it."""
    record = index.records[key]
    index.put(fx, key, replace(record, tier=Tier.SPILLING))
    fx.orders.append(Order(record.worker, ControlOrder(OrderOp.SPILL, key)))
    fx.count("evictions_ordered")


def enforce_disk_budget(index: ResidencyIndex, fx: Effects) -> None:
    if index.disk_budget is None or index.disk_used <= index.disk_budget:
        return
    on_disk = sorted((r.last_used, k) for k, r in index.records.items() if r.tier == Tier.DISK)
    for _, key in on_disk:
        if index.disk_used <= index.disk_budget:
            break
        record = index.records[key]
        fx.unlink.append((key, record.file_mtime_ns))
        fx.count("budget_deletions")
        index.put(fx, key, SessionRecord(Tier.GONE, "", 0, 0, record.last_used))
