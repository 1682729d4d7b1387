"""Idle sessions' KV, least recently used first out, bounded by bytes."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, Protocol, TypeVar


class Sized(Protocol):
    @property
    def nbytes(self) -> int: ...


EntryT = TypeVar("EntryT", bound=Sized)


class SessionPool(Generic[EntryT]):
    """Maps a session key to the KV of its last request while no request uses it.

    A running request takes its session's entry out (`take`) and puts it back when it ends
    (`put`), so an entry in the pool is always idle and may be evicted, and it does not
    change while it is in. `nbytes` is the sum of the entries' sizes or, given `parts` (the
    blocks an entry holds, of `part_bytes` each), the bytes of the distinct blocks they
    hold: entries that share a block count it once. Both are kept up to date as entries come and
    go, not recounted.
    """

    def __init__(
        self,
        budget_bytes: int,
        parts: Callable[[EntryT], Iterable[Hashable]] | None = None,
        part_bytes: Callable[[Any], int] = lambda part: 0,
    ) -> None:
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[str, EntryT] = OrderedDict()
        self._parts = parts
        self._part_bytes = part_bytes
        self._held: Counter[Hashable] = Counter()  # part -> entries holding it
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
            self._count(entry, -1)
        return entry

    def _count(self, entry: EntryT, sign: int) -> None:
        """Account for an entry coming in (+1) or going out (-1)."""
        if self._parts is None:
            self.nbytes += sign * entry.nbytes
            return
        for part in set(self._parts(entry)):
            if not self._held[part]:
                self.nbytes += self._part_bytes(part)
            self._held[part] += sign
            if not self._held[part]:
                del self._held[part]
                self.nbytes -= self._part_bytes(part)

    def put(self, key: str, entry: EntryT) -> list[tuple[str, EntryT]]:
        """Store `entry` as the most recent; returns what was evicted to stay in budget,
        oldest first (the caller may spill it)."""
        self.take(key)
        self._entries[key] = entry
        self._count(entry, +1)
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
            self._count(old, -1)
            evicted.append((old_key, old))
        self.num_evicted += len(evicted)
        return evicted
