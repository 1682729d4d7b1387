"""A session's KV whose layers start at different positions (a windowed model's: the layers
of a sliding window hold only what their window can still see, PagedKV.held_from), packed
for a spill file: each layer's keys (then values) [kv_heads, held tokens, row] one after
another, flat, so the file holds nothing a layer released."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from common.errors import SpillFileError


def ragged(held_from: Sequence[int]) -> bool:
    """Whether some layer holds less than every position."""
    return any(held_from)


def pack(k: np.ndarray, v: np.ndarray, held_from: Sequence[int]) -> tuple[np.ndarray, ...]:
    """Keys and values [layers, kv_heads, n, row] as two flat arrays of each layer's held
    positions, in layer order."""
    return tuple(
        np.concatenate([a[i, :, start:].reshape(-1) for i, start in enumerate(held_from)])
        for a in (k, v)
    )


def packed_items(held_from: Sequence[int], shape: Sequence[int]) -> int:
    """Items of one packed array of KV whose full shape is [layers, kv_heads, n, row]."""
    _, heads, n, row = shape
    return sum(heads * (n - start) * row for start in held_from)


def unpack(
    flat: np.ndarray, held_from: Sequence[int], shape: Sequence[int], dtype: np.dtype[Any]
) -> np.ndarray:
    """A packed array back as [layers, kv_heads, n, row], zeros before each layer's first
    held position (pages never written: they take no memory)."""
    out = np.zeros(tuple(shape), dtype)
    _, heads, n, row = shape
    at = 0
    for i, start in enumerate(held_from):
        size = heads * (n - start) * row
        out[i, :, start:] = flat[at : at + size].reshape(heads, n - start, row)
        at += size
    return out


def checked_held_from(h: dict[str, Any], layers: int, name: str) -> list[int]:
    """A spill file header's first held position of each layer, checked against the
    running model (`layers`) and its tokens; such a file lists no blocks."""
    held, n = h["held_from"], len(h.get("token_ids", []))
    fits = isinstance(held, list) and len(held) == layers and not h.get("blocks")
    if not fits or not all(isinstance(x, int) and 0 <= x <= n for x in held):
        raise SpillFileError(name, "held_from does not fit the running model")
    return held
