"""The grouped expert products (engine/ops/csrc/experts.c) on random experts of Qwen3-30B-A3B's
shapes (128 experts of [768, 2048] gate/up and [2048, 768] down), by pairs per touched
expert: each call routes 8 x m pairs to 8 x m experts (m = 1: decode at batch 1), read in
place from their GGUF blocks; beside it the same products by the dense kernel
(kernels().matmul) on each touched expert's rows decoded into a QuantMatrix, one call an
expert.

    .venv/bin/python -m bench.expert_kernels [--threads N] [--rounds R] [--types Q4_K,Q6_K,Q8_0]

Prints a table: per call, its time, the expert bytes it read (GB/s: the file's bytes of the
touched experts over the call's time) and the time per pair. Successive calls touch disjoint
experts, 8 x m apart, so the weights come from memory as in a step, not from the cache; each
figure is the best of R rounds, the two kernels alternating.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import gguf
import numpy as np

from bench.table import print_table
from engine.device import set_threads
from engine.ops.quant import kernels
from engine.ops.quant.experts import ExpertMatrix
from engine.ops.quant.experts_native import expert_matmul
from engine.ops.quant.formats import decode
from engine.ops.quant.matrix import QuantMatrix

T = gguf.GGMLQuantizationType
NUM_EXPERTS, TOP_K = 128, 8
SHAPES = ((768, 2048), (2048, 768))  # gate/up, down: [N, K]
PAIRS = (1, 2, 4, 8)  # pairs per touched expert
SCALES_AT = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,), T.Q8_0: (0,), T.Q4_0: (0,)}


def random_experts(rng: np.random.Generator, qtype: T, n: int, k: int) -> ExpertMatrix:
    """Random codes with finite f16 scales, [E, n, k] of `qtype`."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (NUM_EXPERTS, n, k // block, size), dtype=np.uint8)
    for at in SCALES_AT[qtype]:
        d = rng.uniform(0.001, 0.05, raw.shape[:3]).astype(np.float16)
        raw[..., at : at + 2] = d.view(np.uint8).reshape(*raw.shape[:3], 2)
    return ExpertMatrix(qtype, raw.reshape(NUM_EXPERTS, n, -1), k)


def timed(run: Callable[[], None]) -> float:
    t = time.perf_counter()
    run()
    return time.perf_counter() - t


class Case:
    """Calls of m pairs per touched expert, 8 x m experts a call, each call the next set."""

    def __init__(self, w: ExpertMatrix, dense: list[QuantMatrix], m: int, threads: int) -> None:
        self.w, self.dense, self.m, self.threads = w, dense, m, threads
        self.touched = TOP_K * m
        rng = np.random.default_rng(m)
        self.x = rng.standard_normal((self.touched * m, w.k)).astype(np.float32)
        self.out = np.empty((self.touched * m, w.n), np.float32)
        self.rows = np.arange(self.touched * m, dtype=np.int64)
        self.sets = NUM_EXPERTS // self.touched
        self.calls = 0

    def experts(self) -> range:
        first = self.calls % self.sets * self.touched
        self.calls += 1
        return range(first, first + self.touched)

    def grouped(self) -> None:
        counts = np.zeros(NUM_EXPERTS, np.int64)
        counts[list(self.experts())] = self.m
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        expert_matmul(self.w, self.x, self.rows, starts, self.out, self.threads)

    def dense_calls(self) -> None:
        matmul, m = kernels().matmul, self.m
        for i, e in enumerate(self.experts()):
            matmul(
                self.dense[e],
                self.x[i * m : (i + 1) * m],
                self.out[i * m : (i + 1) * m],
                self.threads,
            )


def measure(case: Case, rounds: int) -> tuple[float, float]:
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for _ in range(case.sets):  # a round: every expert once, by each kernel
            best[0] = min(best[0], timed(case.grouped))
        for _ in range(case.sets):
            best[1] = min(best[1], timed(case.dense_calls))
    return best[0], best[1]


def cells(seconds: float, case: Case) -> list[str]:
    gb = case.touched * case.w.expert_bytes / seconds / 1e9
    pairs = case.touched * case.m
    return [f"{seconds * 1e3:.2f}", f"{gb:.1f}", f"{seconds * 1e6 / pairs:.1f}"]


def rows_of(qtype: T, n: int, k: int, threads: int, rounds: int) -> list[list[str]]:
    w = random_experts(np.random.default_rng(int(qtype) * n), qtype, n, k)
    dense = [
        QuantMatrix.from_decoded(decode(w.data[e], qtype), qtype.name) for e in range(NUM_EXPERTS)
    ]
    rows = []
    for m in PAIRS:
        case = Case(w, dense, m, threads)
        grouped, by_expert = measure(case, rounds)
        head = [qtype.name, f"{n}x{k}", str(m), str(case.touched)]
        rows.append(head + cells(grouped, case) + cells(by_expert, case))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--types", default="Q4_K,Q6_K,Q8_0")
    args = parser.parse_args()
    threads = set_threads(args.threads)
    table = []
    for name in args.types.split(","):
        for n, k in SHAPES:
            table += rows_of(getattr(T, name), n, k, threads, args.rounds)
    print(
        f"{NUM_EXPERTS} experts, {threads} threads; grouped: wf_expert_matmul in place;"
        " dense: kernels().matmul an expert (its decoded QuantMatrix)"
    )
    header = (
        "type",
        "NxK",
        "pairs/expert",
        "experts",
        "grouped ms",
        "GB/s",
        "us/pair",
        "dense ms",
        "GB/s",
        "us/pair",
    )
    print_table(header, table)


if __name__ == "__main__":
    main()
