"""Engine benchmark: prefill and batched decode speed on the real model, against its
memory-bandwidth floor and, where llama-cpp-python is installed, against llama.cpp.

    .venv/bin/python -m bench.engine [--model PATH] [--threads N] [--repeats R]

Prints a table; every ratio is taken within the same run (the machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from typing import Any

import numpy as np
from numba import njit, prange

from bench.llamacpp import llamacpp_available, measure_llamacpp
from bench.table import print_table
from engine.config import EngineConfig
from engine.device import set_threads
from engine.engine import Engine
from engine.model import Model
from engine.sampling import SamplingParams
from engine.sequence import Request
from warmfleet.models import resolve_model

PROMPT_TOKENS = 512
DECODE_TOKENS = 128
BATCHES = (1, 4, 8, 16)
TEXT = (
    "The history of computing is a story of layers: each generation of engineers builds on "
    "the abstractions of the last, and the best of them remember what lies underneath. "
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@njit(parallel=True, cache=True)
def _parallel_copy(src: np.ndarray, dst: np.ndarray) -> None:  # pragma: no cover
    chunk = 1 << 16
    for c in prange(src.shape[0] // chunk):
        dst[c * chunk : (c + 1) * chunk] = src[c * chunk : (c + 1) * chunk]


@njit(parallel=True, fastmath=True, cache=True)
def _parallel_sum(src: np.ndarray) -> float:  # pragma: no cover
    chunk = 1 << 14
    partial = np.zeros(src.shape[0] // chunk, dtype=np.float32)
    for c in prange(src.shape[0] // chunk):
        a0 = a1 = a2 = a3 = np.float32(0.0)
        for i in range(c * chunk, (c + 1) * chunk, 4):
            a0 += src[i]
            a1 += src[i + 1]
            a2 += src[i + 2]
            a3 += src[i + 3]
        partial[c] = a0 + a1 + a2 + a3
    return float(partial.sum())


def read_bandwidth_gbs(nbytes: int = 512 << 20, repeats: int = 5) -> float:
    """Best rate of streaming a weights-sized buffer through the cores (bytes read/s)."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        _parallel_sum(src)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def copy_bandwidth_gbs(nbytes: int = 512 << 20, repeats: int = 5) -> float:
    """Best memory copy rate (bytes copied per second) on all the engine's threads, over a
    buffer as large as the weights, with every page touched first."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.zeros_like(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        _parallel_copy(src, dst)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def bench_prefill(model: Model, ids: list[int], repeats: int) -> float:
    """Tokens/s of prefilling `ids` from an empty cache (one chunk, first token included)."""
    config = EngineConfig(prefill_chunk_tokens=len(ids), step_prefill_tokens=len(ids))
    best = float("inf")
    for r in range(repeats):
        engine = Engine(model, config)
        engine.add(Request(f"p{r}", ids, SamplingParams(max_tokens=1)))
        t = time.perf_counter()
        engine.step()
        best = min(best, time.perf_counter() - t)
    return len(ids) / best


def bench_decode(model: Model, prompt: list[int], batch: int, repeats: int) -> float:
    """Aggregate tokens/s of `batch` sequences decoding DECODE_TOKENS each (after prefill)."""
    best = float("inf")
    for r in range(repeats):
        engine = Engine(model)
        for i in range(batch):
            # distinct prompts: the same prompt shifted by one token per sequence
            ids = prompt[i : i + 16]
            engine.add(Request(f"d{r}-{i}", ids, SamplingParams(max_tokens=DECODE_TOKENS + 1)))
        while any(s.prefilling for s in engine.sequences.values()) or engine.scheduler.waiting:
            engine.step()
        t = time.perf_counter()
        steps = 0
        while engine.has_work:
            engine.step()
            steps += 1
        best = min(best, (time.perf_counter() - t) / steps)
    return batch / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", metavar="PATH")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    threads = set_threads(args.threads)
    path = resolve_model(args.model)
    log(f"loading {path.name} ({threads} threads)")
    model = Model.load(path, device="cpu")
    ids = model.tokenizer.encode(TEXT * 40)[:PROMPT_TOKENS]
    assert len(ids) == PROMPT_TOKENS

    rows: list[tuple[str, str, str, str]] = []
    log("measuring memory bandwidth")
    bw, read_bw = copy_bandwidth_gbs(), read_bandwidth_gbs()
    floor_ms = model.weights.nbytes / (bw * 1e9) * 1e3
    read_floor_ms = model.weights.nbytes / (read_bw * 1e9) * 1e3
    log("prefill")
    prefill = bench_prefill(model, ids, args.repeats)
    decode: dict[int, float] = {}
    for b in BATCHES:
        log(f"decode, batch {b}")
        decode[b] = bench_decode(model, ids, b, args.repeats)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    lc: dict[str, Any] = {}
    if llamacpp_available():
        log("llama.cpp on the same file")
        lc = measure_llamacpp(str(path), ids, DECODE_TOKENS, threads, args.repeats)
    lc_decode, lc_prefill = lc.get("decode_tok_s"), lc.get("prefill_tok_s")

    def ratio(ours: float, theirs: float | None) -> str:
        return f"{ours / theirs:.2f}x" if theirs else "-"

    rows.append(
        (
            f"prefill, {PROMPT_TOKENS}-token prompt (tok/s)",
            f"{prefill:.0f}",
            f"{lc_prefill:.0f}" if lc_prefill else "-",
            ratio(prefill, lc_prefill),
        )
    )
    for b in BATCHES:
        rows.append(
            (
                f"decode batch {b}, aggregate (tok/s)",
                f"{decode[b]:.1f}",
                f"{lc_decode:.1f} (batch 1)" if lc_decode else "-",
                ratio(decode[b], lc_decode),
            )
        )
    step_ms = 1e3 / decode[1]
    rows.append(("decode step, batch 1 (ms)", f"{step_ms:.1f}", "-", "-"))
    mib = model.weights.nbytes / 2**20
    for kind, rate, floor in (("copy", bw, floor_ms), ("read", read_bw, read_floor_ms)):
        rows.append(
            (
                f"floor: {mib:.0f} MiB weights / {kind} {rate:.1f} GB/s (ms)",
                f"{floor:.1f}",
                "-",
                f"step/floor {step_ms / floor:.2f}x",
            )
        )
    kv = model.new_cache().bytes_per_token
    lc_kv = lc.get("state_bytes", 0) / PROMPT_TOKENS if lc else None
    rows.append(("KV bytes per token", f"{kv}", f"{lc_kv:.0f} (f16)" if lc_kv else "-", "-"))
    rows.append(("peak RSS (MiB)", f"{rss_mib:.0f}", "-", "-"))

    print_table(("figure", "warmfleet", "llama.cpp", "ratio"), rows)


if __name__ == "__main__":
    main()
