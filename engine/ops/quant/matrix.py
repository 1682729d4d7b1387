"""A weight matrix kept in its quantized form, as the kernels read it (see formats.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import gguf
import numpy as np

from engine.ops.quant.formats import (
    DECODERS,
    HALF_GROUPS,
    KIND_BF16,
    KIND_F16,
    KIND_Q4,
    KIND_Q8,
    Decoded,
    pack_nibbles,
)

GROUP_SHIFT = {16: 4, 32: 5}


@dataclass(frozen=True, slots=True)
class QuantMatrix:
    """[N, K] weights: codes [N, row bytes] and per-group scale and offset [N, K / group],
    float16 where every value is exactly a float16 (Q4_0, Q4_1, Q8_0: the file's own
    scales, so the matrix takes the file's size), else float32."""

    kind: int
    group: int
    codes: np.ndarray
    scale: np.ndarray
    offset: np.ndarray
    k: int
    source: str  # the GGUF type(s) it came from, e.g. "Q4_1"
    pointers: tuple[int, int, int] = field(init=False)  # the arrays' addresses, for C calls

    def __post_init__(self) -> None:
        codes, scale, offset = (a.ctypes.data for a in self.arrays)
        object.__setattr__(self, "pointers", (codes, scale, offset))

    @classmethod
    def from_decoded(cls, d: Decoded, source: str) -> QuantMatrix:
        k = d.codes.shape[1] // 2 if d.kind in (KIND_F16, KIND_BF16) else d.codes.shape[1]
        codes = pack_nibbles(d.codes) if d.kind == KIND_Q4 else d.codes
        scale, offset = _narrowed(d.scale, d.offset)
        return cls(d.kind, d.group, codes, scale, offset, k, source)

    @property
    def half(self) -> bool:
        """The scales and offsets are stored as float16."""
        return bool(self.scale.dtype == np.float16)

    @property
    def c_kind(self) -> int:
        """The kind as qmatmul.c reads it (Q4H/Q8H: float16 scales)."""
        return self.kind + HALF_GROUPS if self.half else self.kind

    def float32_groups(self) -> tuple[np.ndarray, np.ndarray]:
        """The scales and offsets as float32 (a copy where they are float16)."""
        return (self.scale.astype(np.float32, copy=False),
                self.offset.astype(np.float32, copy=False))  # fmt: skip

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (self.codes, self.scale, self.offset)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.codes.shape[0], self.k)

    @property
    def gshift(self) -> int:
        return GROUP_SHIFT[self.group]

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays)

    def take(self, order: np.ndarray) -> QuantMatrix:
        """The rows in `order` (e.g. the rope permutation of Q and K)."""
        codes, scale, offset = (np.ascontiguousarray(a[order]) for a in self.arrays)
        return QuantMatrix(self.kind, self.group, codes, scale, offset, self.k, self.source)

    def as_codes(self, kind: int, group: int) -> QuantMatrix:
        """The same weights with one byte per code and/or smaller groups (lossless)."""
        codes, scale, offset = self.codes, self.scale, self.offset
        if self.kind == KIND_Q4 and kind == KIND_Q8:
            g = codes.reshape(codes.shape[0], -1, 1, 16)
            codes = np.concatenate([g & 0x0F, g >> 4], axis=2).reshape(codes.shape[0], -1)
        if group != self.group:
            scale = np.repeat(scale, self.group // group, axis=1)
            offset = np.repeat(offset, self.group // group, axis=1)
        return QuantMatrix(kind, group, np.ascontiguousarray(codes), scale, offset, self.k,
                           self.source)  # fmt: skip


def _narrowed(scale: np.ndarray, offset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The groups as float16 where both arrays hold float16 values exactly (the same
    float32 values once widened), else as they are."""
    if not scale.size:
        return scale, offset
    with np.errstate(over="ignore"):
        s16, o16 = scale.astype(np.float16), offset.astype(np.float16)
    if np.array_equal(s16.astype(np.float32), scale) and np.array_equal(
        o16.astype(np.float32), offset
    ):
        return s16, o16
    return scale, offset


def concat(parts: Sequence[QuantMatrix]) -> QuantMatrix | None:
    """The parts' rows stacked into one matrix (codes widened where their kinds differ), or
    None where they cannot share one form (half-precision beside codes)."""
    kinds = {p.kind for p in parts}
    if len({p.k for p in parts}) > 1 or (len(kinds) > 1 and not kinds <= {KIND_Q4, KIND_Q8}):
        return None
    kind, group = max(kinds), min(p.group for p in parts)
    same = [p.as_codes(kind, group) if (p.kind, p.group) != (kind, group) else p for p in parts]
    sources = dict.fromkeys(p.source for p in parts)
    return QuantMatrix(kind, group, np.concatenate([p.codes for p in same]),
                       np.concatenate([p.scale for p in same]),
                       np.concatenate([p.offset for p in same]), parts[0].k,
                       "+".join(sources))  # fmt: skip


def is_supported(qtype: gguf.GGMLQuantizationType, k: int) -> bool:
    """A kernel reads this type with rows of k weights."""
    return qtype in DECODERS and k % 32 == 0


__all__ = ["KIND_BF16", "KIND_F16", "KIND_Q4", "KIND_Q8", "QuantMatrix", "concat"]
