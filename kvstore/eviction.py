"""The eviction policy, as pure functions of the session table: which idle sessions leave a
worker's memory for disk to bring its warm bytes within its budget, and which spill files
are deleted to bring the spill directory within the disk budget; least recently used first
both. Sessions in a running request (hot) are never chosen. The index (index.py) asks, and
carries the choice out."""

from __future__ import annotations

from common.enums import Tier
from kvstore.session_table import SessionTable


def warm_victims(table: SessionTable, worker: str, budget: int | None) -> list[str]:
    """The worker's warm sessions to spill (none without a budget), each counted whole (at
    most what its spill frees: the worker's next count corrects a shortfall)."""
    if budget is None:
        return []
    total, victims = table.warm_bytes(worker), []
    for key in table.least_recent(Tier.WARM, worker):
        if total <= budget:
            break
        total -= table.records[key].nbytes
        victims.append(key)
    return victims


def disk_victims(table: SessionTable, budget: int | None) -> list[str]:
    """The sessions on disk whose files go (none without a budget), each freeing its own
    file and the blocks no other session on disk lists."""
    if budget is None or table.disk.used <= budget:
        return []
    order, victims = table.least_recent(Tier.DISK), []
    for key, used in zip(order, table.disk.used_after_removing(order), strict=True):
        victims.append(key)
        if used <= budget:
            break
    return victims
