"""What applying events and commands to the index asks the kvstore to do, all carried out in
one Redis transaction with the events' acknowledgement."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.messages import CommandAnswer, ControlOrder
from broker.records import SessionRecord


@dataclass(frozen=True, slots=True)
class Order:
    """A control order for one worker ("" = any worker of the host)."""

    worker: str
    order: ControlOrder


@dataclass(slots=True)
class Effects:
    upserts: dict[str, SessionRecord] = field(default_factory=dict)
    removals: set[str] = field(default_factory=set)
    orders: list[Order] = field(default_factory=list)
    unlink: list[tuple[str, int]] = field(default_factory=list)  # (key, mtime_ns; 0 = any)
    counters: dict[str, int] = field(default_factory=dict)
    replies: list[tuple[str, CommandAnswer]] = field(default_factory=list)  # (reply key, answer)
    # the prefix marks (hex) each session a worker just started a request on now holds
    marks: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return not (
            self.upserts
            or self.removals
            or self.orders
            or self.unlink
            or self.counters
            or self.replies
            or self.marks
        )

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
        self.marks.update(other.marks)
