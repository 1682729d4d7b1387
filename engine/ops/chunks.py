"""Which prefill chunks the compiled kernels take beside the decode rows, by the kernels'
build; longer chunks go to BLAS (their products against weights expanded to float32), each
chunk in calls of its own, their attention in the compiled kernel on x86
(kernel_attention_rows) and over gathered keys elsewhere. A row's path, and so its
bits, depends on its own chunk's length only, never on what else runs in the step (batch
invariance).

Where the kernels' 16-lane vectors are pairs of 8-lane registers (AVX2), one chunk after 600
cached positions took, in the kernels against BLAS products with the attention in the kernel
both ways (2 Zen 4 cores built for AVX2, the default model, bench/RESULTS.md), 0.87x the time
at 64 rows, 0.98x at 96 and 128, 1.05x at 192 and 1.11x at 256: the bound is 128 rows. NEON
and plain C builds keep SMALL_ROWS until measured. WARMFLEET_CHUNK_ROWS sets the bound on any
build (at least SMALL_ROWS; `all`: every chunk), to measure it on another CPU
(bench.chunk_paths); set it before the process starts. On x86 it bounds the products only:
the attention kernel takes every chunk there (kernel_attention_rows).
"""

from __future__ import annotations

import os

from common.errors import InvalidRequestError
from engine.ops import native

SMALL_ROWS = 32  # prefill chunks up to this long stay in the kernels on every build
AVX2_CHUNK_ROWS = 128  # on AVX2, as measured above
CHUNK_ROWS_ENV = "WARMFLEET_CHUNK_ROWS"


def kernel_chunk_rows() -> int | None:
    """The longest chunk the compiled kernels take: WARMFLEET_CHUNK_ROWS where set, else
    every one (None) where their vectors are single registers (AVX-512), AVX2_CHUNK_ROWS on
    AVX2, SMALL_ROWS on other builds."""
    asked = os.environ.get(CHUNK_ROWS_ENV, "").strip().lower()
    if asked:
        return _asked_rows(asked)
    if native.wide_vectors():
        return None
    return AVX2_CHUNK_ROWS if native.builds_for("avx2") else SMALL_ROWS


def kernel_attention_rows() -> int | None:
    """The longest chunk the compiled attention kernel takes (engine/ops/attention_rows.py):
    every one on x86 builds, AVX-512 and AVX2 (there, in 8-lane halves, it took 0.22-0.42x
    the time of gathering the keys for BLAS at 64-512 rows: bench/RESULTS.md, so a chunk past
    the products' bound attends in the kernel all the same); elsewhere the products' bound,
    kernel_chunk_rows, until measured."""
    if native.wide_vectors() or native.builds_for("avx2"):
        return None
    return kernel_chunk_rows()


def _asked_rows(asked: str) -> int | None:
    if asked == "all":
        return None
    if asked.isdigit() and int(asked) >= SMALL_ROWS:
        return int(asked)
    why = f"must be a number of rows (at least {SMALL_ROWS}) or all, got {asked!r}"
    raise InvalidRequestError(CHUNK_ROWS_ENV, why)
