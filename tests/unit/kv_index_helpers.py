"""Shared helpers of the residency index tests: events, commands and an index with no
Redis and no files (spill files are a dict that `file_info` reads)."""

from __future__ import annotations

from broker.messages import (
    AnswerStatus,
    CommandAnswer,
    CommandOp,
    ControlOrder,
    EventKind,
    GoneReason,
    Held,
    KVCommand,
    OrderOp,
    SessionEvent,
)
from kvstore.effects import Effects, Order
from kvstore.index import ResidencyIndex

W0, W1 = "w0", "w1"
S1, S2, S3, S4 = "local/s1", "local/s2", "local/s3", "local/s4"
REPLY = "reply:1"
TOKENS = 10
NOW = 50.0
BIG_BUDGET = 10**9

Files = dict[str, tuple[int, int]]  # key -> (size, mtime_ns) of its spill file


def make_index(
    workers: dict[str, int] | None = None,
    files: Files | None = None,
    disk_budget: int | None = None,
) -> ResidencyIndex:
    found: Files = {} if files is None else files
    index = ResidencyIndex(disk_budget, lambda key: found.get(key))
    index.set_workers({W0: BIG_BUDGET} if workers is None else workers)
    return index


def hot(
    key: str, last_used: float, nbytes: int = 100, worker: str = W0, came_from: str = ""
) -> SessionEvent:
    return SessionEvent(EventKind.HOT, worker, key, TOKENS, nbytes, last_used, source=came_from)


def warm(key: str, last_used: float, nbytes: int = 100, worker: str = W0) -> SessionEvent:
    return SessionEvent(EventKind.WARM, worker, key, TOKENS, nbytes, last_used)


def disk(key: str, size: int, mtime_ns: int, worker: str = W0) -> SessionEvent:
    return SessionEvent(EventKind.DISK, worker, key, TOKENS, size, 99.0, file_mtime_ns=mtime_ns)


def gone(key: str, reason: GoneReason, worker: str = W0) -> SessionEvent:
    return SessionEvent(EventKind.GONE, worker, key, reason=reason)


def command(op: CommandOp, key: str, new_key: str = "") -> KVCommand:
    return KVCommand(op, key, REPLY, new_key)


def inventory(worker: str, held: list[Held], now: float) -> SessionEvent:
    return SessionEvent(EventKind.INVENTORY, worker, last_used=now, held=tuple(held))


def answer(status: AnswerStatus, tier: str = "") -> CommandAnswer:
    return CommandAnswer(status, tier)


def apply_all(index: ResidencyIndex, *items: SessionEvent | KVCommand, now: float = NOW) -> Effects:
    fx = Effects()
    for item in items:
        fx.merge(index.apply(item, now))
    return fx


def spill_order(key: str, worker: str = W0) -> Order:
    return Order(worker, ControlOrder(OrderOp.SPILL, key))


def fork_order(worker: str) -> Order:
    return Order(worker, ControlOrder(OrderOp.FORK, S1, S2, REPLY))


def on_disk(key: str, last_used: float, size: int, mtime_ns: int) -> ResidencyIndex:
    """An index holding one session on disk (spilled by W0, which is still alive)."""
    index = make_index()
    apply_all(index, warm(key, last_used), disk(key, size, mtime_ns))
    assert index.table.records[key].tier == "disk"
    return index
