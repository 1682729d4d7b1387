"""The KV pool's dtypes: float32, float16 and q8_0, by name and by what an array holds.

q8_0 is llama.cpp's block of 32 values (its `--cache-type-k q8_0`): one float16 scale d and
32 int8 codes q, 34 bytes, 8.5 bits a value; a value is d * q. Here it is a NumPy structured
dtype, so a pool of it is an array like any other (blocks copied, gathered, spilled and
read back whole), its last axis head_dim / 32 such blocks. A value is quantized from its
own block of 32 only: the same bytes however the step that wrote it was batched.

Quantizing, the same arithmetic in C (layers.c) and NumPy (`quantize`), in float32: amax
the block's largest magnitude, d = amax / 127, codes rint(x * (1 / d)) (ties to even; 0
where d is 0), d stored rounded to float16 (to nearest even). Dequantized, float(d) * q is
exact in float32 (11 significant bits by 8), which is what the attention kernels compute
as they load a block: their results are the float32 kernel's on `dequantize`'s values.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

Q8_VALUES = 32  # values a q8_0 block holds
Q8_0 = np.dtype([("d", "<f2"), ("q", "i1", (Q8_VALUES,))])  # 34 bytes, unaligned
assert Q8_0.itemsize == 34
NAMES: dict[str, np.dtype[Any]] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "q8_0": Q8_0,
}
KINDS = tuple(NAMES.values())  # the C kernels' kv_kind is a dtype's index here (0, 1, 2)


def kv_name(dtype: Any) -> str:
    """The dtype's name as --kv-dtype, files and the heartbeat say it."""
    dtype = np.dtype(dtype)
    return "q8_0" if dtype == Q8_0 else dtype.name


def kv_str(dtype: Any) -> str:
    """What a KV file's header says of its dtype: NumPy's string for it ("<f4", "<f2"),
    "q8_0" for q8_0."""
    dtype = np.dtype(dtype)
    return "q8_0" if dtype == Q8_0 else dtype.str


def kv_dtype_named(name: Any) -> np.dtype[Any]:
    """The dtype of a name kv_name or kv_str gives; TypeError for what names none."""
    if not isinstance(name, str):
        raise TypeError(f"not a dtype name: {name!r}")
    found = NAMES.get(name)
    return found if found is not None else np.dtype(name)


def values_per_item(dtype: Any) -> int:
    """Values of the model's keys or values one array element holds."""
    return Q8_VALUES if np.dtype(dtype) == Q8_0 else 1


def row_items(head_dim: int, dtype: Any) -> int:
    """Elements of one head's keys (or values) at one position."""
    return head_dim // values_per_item(dtype)


def row_bytes(head_dim: int, dtype: Any) -> int:
    """Bytes of one head's keys (or values) at one position."""
    return row_items(head_dim, dtype) * np.dtype(dtype).itemsize


def token_bytes(num_layers: int, num_kv_heads: int, head_dim: int, dtype: Any) -> int:
    """KV bytes of one position, keys and values of every layer."""
    return 2 * num_layers * num_kv_heads * row_bytes(head_dim, dtype)


def value_bytes(dtype: Any) -> float:
    """Bytes a value takes: 4, 2, or 34 / 32 for q8_0."""
    dtype = np.dtype(dtype)
    return dtype.itemsize / values_per_item(dtype)


def fits(head_dim: int, dtype: Any) -> bool:
    """Whether a head's values split into whole elements of `dtype`."""
    return head_dim % values_per_item(dtype) == 0


def quantize(x: np.ndarray) -> np.ndarray:
    """float32 values [..., D] as q8_0 blocks [..., D / 32]."""
    return quantize_bytes(np.asarray(x), np).view(Q8_0)


def quantize_bytes(x: Any, xp: ModuleType) -> Any:
    """Values [..., D] as q8_0 blocks' bytes, [..., D / 32 * 34] uint8 (each block its
    float16 d, little-endian, then its 32 codes), on NumPy (`quantize` views them as q8_0)
    or CuPy, whose arrays hold no structured dtype (a q8_0 pool on a GPU holds these
    bytes): the same arithmetic, so the same bytes."""
    x = x.astype(np.float32)
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // Q8_VALUES, Q8_VALUES)
    d = xp.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
    inverse = xp.where(d > 0, np.float32(1) / xp.where(d > 0, d, np.float32(1)), np.float32(0))
    codes = xp.rint(blocks * inverse.astype(np.float32)).astype(np.int8).view(np.uint8)
    scale = d.astype(np.float16).view(np.uint8)  # [..., D / 32, 2]
    return xp.concatenate([scale, codes], axis=-1).reshape(*x.shape[:-1], -1)


def dequantize(q: np.ndarray) -> np.ndarray:
    """q8_0 blocks [..., D / 32] as float32 values [..., D]."""
    values = q["d"].astype(np.float32)[..., None] * q["q"].astype(np.float32)
    return values.reshape(*q.shape[:-1], q.shape[-1] * Q8_VALUES)


def widened(a: np.ndarray) -> np.ndarray:
    """A pool's or file's keys or values as float32 (float32: as they are)."""
    return dequantize(a) if a.dtype == Q8_0 else a.astype(np.float32, copy=False)
