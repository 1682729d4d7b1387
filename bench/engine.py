"""Engine benchmark: prefill and batched decode speed on the real model, against its
memory-bandwidth floor and, where llama-cpp-python is installed, against llama.cpp.

    .venv/bin/python -m bench.engine [--model PATH] [--threads N] [--repeats R]
                                     [--weights auto|quantized|float32]

Prints a table; every ratio is taken within the same run (the machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit, prange

from bench.llamacpp import llamacpp_available, measure_llamacpp
from bench.table import print_table
from common.sampling import SamplingParams
from engine.config import EngineConfig
from engine.device import set_threads
from engine.engine import Engine
from engine.model import Model
from engine.sequence import Request
from engine.weights import WEIGHT_MODES
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


Row = tuple[str, str, str, str]


@dataclass(slots=True)
class Figures:
    """This engine's measurements in one run."""

    copy_gbs: float
    read_gbs: float
    prefill_tok_s: float
    decode_tok_s: dict[int, float]  # by batch size
    peak_rss_mib: float

    def best(self, other: Figures) -> Figures:
        decode = {b: max(v, other.decode_tok_s[b]) for b, v in self.decode_tok_s.items()}
        return Figures(max(self.copy_gbs, other.copy_gbs), max(self.read_gbs, other.read_gbs),
                       max(self.prefill_tok_s, other.prefill_tok_s), decode,
                       max(self.peak_rss_mib, other.peak_rss_mib))  # fmt: skip


def best_of(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """llama.cpp's figures of two rounds: the higher rates, the shorter times."""
    return {k: (max if k.endswith("tok_s") else min)(v, b[k]) for k, v in a.items()}


def measure(model: Model, ids: list[int], repeats: int) -> Figures:
    """Memory bandwidth, the prefill of `ids` and decode at every batch size in BATCHES, then
    the peak RSS so far."""
    log("measuring memory bandwidth")
    bw, read_bw = copy_bandwidth_gbs(), read_bandwidth_gbs()
    log("prefill")
    prefill = bench_prefill(model, ids, repeats)
    decode: dict[int, float] = {}
    for b in BATCHES:
        log(f"decode, batch {b}")
        decode[b] = bench_decode(model, ids, b, repeats)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return Figures(bw, read_bw, prefill, decode, rss_mib)


def measure_reference(path: Path, ids: list[int], threads: int, repeats: int) -> dict[str, float]:
    """llama.cpp's figures on the same file; empty when llama-cpp-python is not installed."""
    if not llamacpp_available():
        return {}
    log("llama.cpp on the same file")
    return measure_llamacpp(str(path), ids, DECODE_TOKENS, threads, repeats)


def ratio(ours: float, theirs: float | None) -> str:
    """`ours / theirs` as "1.23x"; "-" when there is nothing to compare with."""
    return f"{ours / theirs:.2f}x" if theirs else "-"


def speed_rows(figures: Figures, lc: dict[str, float]) -> list[Row]:
    """Prefill and decode speed, each against llama.cpp where it was measured."""
    lc_decode, lc_prefill = lc.get("decode_tok_s"), lc.get("prefill_tok_s")
    rows = [
        (
            f"prefill, {PROMPT_TOKENS}-token prompt (tok/s)",
            f"{figures.prefill_tok_s:.0f}",
            f"{lc_prefill:.0f}" if lc_prefill else "-",
            ratio(figures.prefill_tok_s, lc_prefill),
        )
    ]
    for b in BATCHES:
        rows.append(
            (
                f"decode batch {b}, aggregate (tok/s)",
                f"{figures.decode_tok_s[b]:.1f}",
                f"{lc_decode:.1f} (batch 1)" if lc_decode else "-",
                ratio(figures.decode_tok_s[b], lc_decode),
            )
        )
    return rows


def floor_rows(model: Model, figures: Figures) -> list[Row]:
    """The batch-1 decode step against the time to stream the weights once (copy and read)."""
    step_ms = 1e3 / figures.decode_tok_s[1]
    rows = [("decode step, batch 1 (ms)", f"{step_ms:.1f}", "-", "-")]
    mib = model.weights.nbytes / 2**20
    for kind, rate in (("copy", figures.copy_gbs), ("read", figures.read_gbs)):
        floor = model.weights.nbytes / (rate * 1e9) * 1e3
        rows.append(
            (
                f"floor: {mib:.0f} MiB weights / {kind} {rate:.1f} GB/s (ms)",
                f"{floor:.1f}",
                "-",
                f"step/floor {step_ms / floor:.2f}x",
            )
        )
    return rows


def memory_rows(
    model: Model, figures: Figures, lc: dict[str, float], file_bytes: int, loaded_rss: int
) -> list[Row]:
    """Weights in memory and the RSS the load added, against the GGUF file's size; KV
    bytes per token (llama.cpp's from its saved state) and peak RSS."""
    kv = model.bytes_per_token
    lc_kv = lc.get("state_bytes", 0) / PROMPT_TOKENS if lc else None
    mib, file_mib = model.weight_bytes / 2**20, file_bytes / 2**20
    return [
        (f"weights in memory, {model.weights_mode} (MiB)", f"{mib:.0f}",
         f"{file_mib:.0f} (GGUF file)", f"{mib / file_mib:.2f}x file"),
        ("RSS added by the load (MiB)", f"{loaded_rss / 2**20:.0f}", "-",
         f"{loaded_rss / file_bytes:.2f}x file"),
        ("KV bytes per token", f"{kv}", f"{lc_kv:.0f} (f16)" if lc_kv else "-", "-"),
        ("peak RSS (MiB)", f"{figures.peak_rss_mib:.0f}", "-", "-"),
    ]  # fmt: skip


def rss_bytes() -> int:
    """This process's resident memory now (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", metavar="PATH")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--weights", choices=WEIGHT_MODES, default="auto")
    args = parser.parse_args()
    threads = set_threads(args.threads)
    path = resolve_model(args.model)
    log(f"loading {path.name} ({threads} threads, weights {args.weights})")
    rss_before = rss_bytes()
    model = Model.load(path, device="cpu", weights=args.weights)
    loaded_rss = rss_bytes() - rss_before
    ids = model.tokenizer.encode(TEXT * 40)[:PROMPT_TOKENS]
    assert len(ids) == PROMPT_TOKENS

    # rounds alternate between the two engines, and each figure is the best of its rounds:
    # this machine's speed drifts by up to 2x over minutes, which one long run of each
    # would turn into a false ratio
    figures, lc = measure(model, ids, 1), measure_reference(path, ids, threads, 1)
    for r in range(1, args.repeats):
        log(f"round {r + 1} of {args.repeats}")
        figures = figures.best(measure(model, ids, 1))
        lc = best_of(lc, measure_reference(path, ids, threads, 1))
    rows = [*speed_rows(figures, lc), *floor_rows(model, figures)]
    rows += memory_rows(model, figures, lc, path.stat().st_size, loaded_rss)
    print_table(("figure", "warmfleet", "llama.cpp", "ratio"), rows)


if __name__ == "__main__":
    main()
