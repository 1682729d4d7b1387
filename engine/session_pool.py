"""Idle sessions' KV, least recently used first out, bounded by bytes."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar


class Sized(Protocol):
    @property
    def nbytes(self) -> int: ...


EntryT = TypeVar("EntryT", bound=Sized)


class SessionPool(Generic[EntryT]):
    """Maps a session key to the KV of its last request while no request uses it.

    A running request takes its session's entry out (`take`) and puts it back when it ends
    (`put`), so an entry in the pool is always idle and may be evicted. `measure` gives the
    bytes a set of entries holds (entries that share blocks count them once); by default
    the sum of their sizes.
    """

    def __init__(
        self, budget_bytes: int, measure: Callable[[Iterable[EntryT]], int] | None = None
    ) -> None:
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[str, EntryT] = OrderedDict()
        self._measure = measure or (lambda entries: sum(e.nbytes for e in entries))
        self.nbytes = 0
        self.num_evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def keys(self) -> list[str]:
        """Keys from least to most recently used."""
        return list(self._entries)

    def items(self) -> list[tuple[str, EntryT]]:
        """(key, entry) from least to most recently used."""
        return list(self._entries.items())

    def peek(self, key: str) -> EntryT | None:
        """The entry, without taking it or touching its recency."""
        return self._entries.get(key)

    def take(self, key: str) -> EntryT | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.nbytes = self._measure(self._entries.values())
        return entry

    def put(self, key: str, entry: EntryT) -> list[tuple[str, EntryT]]:
        """Store `entry` as the most recent; returns what was evicted to stay in budget,
        oldest first (the caller may spill it)."""
        self._entries.pop(key, None)
        self._entries[key] = entry
        self.nbytes = self._measure(self._entries.values())
        return self.shrink()

    def pop_oldest(self) -> tuple[str, EntryT] | None:
        """Evict the least recently used entry whatever the budget (room is needed)."""
        if not self._entries:
            return None
        key = next(iter(self._entries))
        entry = self.take(key)
        assert entry is not None
        self.num_evicted += 1
        return key, entry

    def shrink(self) -> list[tuple[str, EntryT]]:
        """Evict the least recently used entries until the pool is within its budget (after
        the budget was lowered); what was evicted, oldest first."""
        evicted: list[tuple[str, EntryT]] = []
        while self.nbytes > self.budget_bytes and self._entries:
            old_key, old = self._entries.popitem(last=False)
            self.nbytes = self._measure(self._entries.values())
            evicted.append((old_key, old))
        self.num_evicted += len(evicted)
        return evicted
