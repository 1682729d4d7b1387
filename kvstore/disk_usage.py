"""The bytes the spill directory holds for the sessions on disk: each session's own file,
and every block some of them list, once however many list it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator

# file_blocks(key) -> (bytes of the session's own file, {block hash: bytes}), or None when
# there is no such file to read (then the record's own size stands for it)
FileBlocks = Callable[[str], "tuple[int, dict[str, int]] | None"]


class DiskUsage:
    def __init__(self, file_blocks: FileBlocks) -> None:
        self.file_blocks = file_blocks
        self._files: dict[str, tuple[int, tuple[str, ...]]] = {}
        self._refs: Counter[str] = Counter()
        self._block_bytes: dict[str, int] = {}
        self.used = 0

    def add(self, key: str, nbytes: int) -> None:
        """A session is on disk (`nbytes`: its record's size, used when its file cannot be
        read)."""
        self.remove(key)
        found = self.file_blocks(key)
        own, blocks = (nbytes, {}) if found is None else found
        self._files[key] = (own, tuple(blocks))
        self.used += own
        for h, size in blocks.items():
            if self._refs[h] == 0:
                self._block_bytes[h] = size
                self.used += size
            self._refs[h] += 1

    def remove(self, key: str) -> None:
        """A session is no longer on disk: its file's bytes, and those of the blocks no
        other session on disk lists, are no longer counted."""
        held = self._files.pop(key, None)
        if held is None:
            return
        own, blocks = held
        self.used -= own
        for h in blocks:
            self._refs[h] -= 1
            if self._refs[h] == 0:
                del self._refs[h]
                self.used -= self._block_bytes.pop(h)

    def used_after_removing(self, keys: Iterable[str]) -> Iterator[int]:
        """`used` as it would be after removing each of `keys` (sessions on disk) in turn;
        nothing is removed."""
        removed: Counter[str] = Counter()
        used = self.used
        for key in keys:
            own, blocks = self._files[key]
            used -= own
            for h in blocks:
                removed[h] += 1
                if removed[h] == self._refs[h]:
                    used -= self._block_bytes[h]
            yield used
