"""The grouped expert products (engine/ops/csrc/experts.c) on random experts of Qwen3-30B-A3B's
shapes (128 experts of [768, 2048] gate/up and [2048, 768] down), by pairs per touched
expert: each call routes 8 x m pairs to 8 x m experts (m = 1: decode at batch 1), read in
place from their GGUF blocks, in float32 products (each weight dequantized) and in integer
ones (activations quantized to 8 bits: experts_int.c); with --dense, beside them the same
products by the dense kernel (kernels().matmul) on each touched expert's rows decoded into
a QuantMatrix, one call an expert. Then the vocabulary matrix [151936, 2048] Q6_K as one
expert, at 1, 8 and 32 rows (--vocab-rows; 0 for none).

    nice .venv/bin/python -m bench.expert_kernels [--threads N] [--rounds R]
        [--types Q4_K,Q6_K,Q8_0] [--dense] [--vocab-rows 1,8,32]

Prints tables: per call, its time and the expert bytes it read (GB/s: the file's bytes of
the touched experts over the call's time). Successive calls touch disjoint experts, 8 x m
apart, so the weights come from memory as in a step, not from the cache; each figure is the
best of R rounds, the kernels alternating.
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
from engine.ops.quant.experts_native import Products, expert_matmul
from engine.ops.quant.formats import decode
from engine.ops.quant.matrix import QuantMatrix

T = gguf.GGMLQuantizationType
NUM_EXPERTS, TOP_K = 128, 8
SHAPES = ((768, 2048), (2048, 768))  # gate/up, down: [N, K]
PAIRS = (1, 2, 4, 8)  # pairs per touched expert
VOCAB = (151936, 2048)  # Qwen3's output matrix, Q6_K in its Q4_K_M file
SCALES_AT = {
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
    T.Q8_0: (0,),
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
}
KERNELS = ("float", "integer", "dense")


def random_experts(
    rng: np.random.Generator, qtype: T, n: int, k: int, num_experts: int = NUM_EXPERTS
) -> ExpertMatrix:
    """Random codes with finite f16 scales, [E, n, k] of `qtype`."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (num_experts, n, k // block, size), dtype=np.uint8)
    for at in SCALES_AT[qtype]:
        d = rng.uniform(0.001, 0.05, raw.shape[:3]).astype(np.float16)
        raw[..., at : at + 2] = d.view(np.uint8).reshape(*raw.shape[:3], 2)
    return ExpertMatrix(qtype, raw.reshape(num_experts, n, -1), k)


def timed(run: Callable[[str], None], kernel: str) -> float:
    t = time.perf_counter()
    run(kernel)
    return time.perf_counter() - t


class Case:
    """Calls of m pairs per touched expert, 8 x m experts a call, each call the next set."""

    def __init__(self, w: ExpertMatrix, dense: list[QuantMatrix], m: int, threads: int) -> None:
        self.w, self.dense, self.m, self.threads = w, dense, m, threads
        self.touched = min(TOP_K * m, w.num_experts)
        rng = np.random.default_rng(m)
        self.x = rng.standard_normal((self.touched * m, w.k)).astype(np.float32)
        self.out = np.empty((self.touched * m, w.n), np.float32)
        self.rows = np.arange(self.touched * m, dtype=np.int64)
        self.sets = w.num_experts // self.touched
        self.calls = 0

    def experts(self) -> range:
        first = self.calls % self.sets * self.touched
        self.calls += 1
        return range(first, first + self.touched)

    def grouped(self, products: Products) -> None:
        counts = np.zeros(self.w.num_experts, np.int64)
        counts[list(self.experts())] = self.m
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        expert_matmul(self.w, self.x, self.rows, starts, self.out, self.threads, products)

    def dense_calls(self) -> None:
        matmul, m = kernels().matmul, self.m
        for i, e in enumerate(self.experts()):
            matmul(
                self.dense[e],
                self.x[i * m : (i + 1) * m],
                self.out[i * m : (i + 1) * m],
                self.threads,
            )

    def run(self, kernel: str) -> None:
        if kernel == "dense":
            self.dense_calls()
        else:
            self.grouped(Products.FLOAT if kernel == "float" else Products.INTEGER)


def measure(case: Case, rounds: int, names: tuple[str, ...]) -> dict[str, float]:
    best = dict.fromkeys(names, float("inf"))
    for _ in range(rounds):
        for name in names:
            for _ in range(case.sets):  # a round: every expert once, by each kernel
                best[name] = min(best[name], timed(case.run, name))
    return best


def cells(seconds: float, case: Case) -> list[str]:
    gb = case.touched * case.w.expert_bytes / seconds / 1e9
    return [f"{seconds * 1e3:.2f}", f"{gb:.1f}"]


def rows_of(qtype: T, n: int, k: int, threads: int, rounds: int, dense: bool) -> list[list[str]]:
    w = random_experts(np.random.default_rng(int(qtype) * n), qtype, n, k)
    decoded = [
        QuantMatrix.from_decoded(decode(w.data[e], qtype), qtype.name)
        for e in range(NUM_EXPERTS if dense else 0)
    ]
    names = KERNELS if dense else KERNELS[:2]
    rows = []
    for m in PAIRS:
        case = Case(w, decoded, m, threads)
        best = measure(case, rounds, names)
        row = [qtype.name, f"{n}x{k}", str(m), str(case.touched)]
        for name in names:
            row += cells(best[name], case)
        rows.append([*row, f"{best['float'] / best['integer']:.2f}"])
    return rows


def vocab_rows(threads: int, rounds: int, counts: list[int]) -> list[list[str]]:
    """The [151936, 2048] Q6_K matrix as one expert, every row a pair of it."""
    w = random_experts(np.random.default_rng(0), T.Q6_K, *VOCAB, num_experts=1)
    rows = []
    for m in counts:
        case = Case(w, [], m, threads)
        case.touched, case.sets = 1, 1  # one expert, m pairs
        case.x, case.out = case.x[:m], np.empty((m, w.n), np.float32)
        case.rows = np.arange(m, dtype=np.int64)
        best = measure(case, rounds, KERNELS[:2])
        row = ["Q6_K", f"{VOCAB[0]}x{VOCAB[1]}", str(m)]
        row += cells(best["float"], case) + cells(best["integer"], case)
        rows.append([*row, f"{best['float'] / best['integer']:.2f}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--types", default="Q4_K,Q6_K,Q8_0")
    parser.add_argument("--dense", action="store_true", help="also the dense kernel, by expert")
    parser.add_argument("--vocab-rows", default="1,8,32")
    args = parser.parse_args()
    threads = set_threads(args.threads)
    table = []
    for name in [t for t in args.types.split(",") if t]:
        for n, k in SHAPES:
            table += rows_of(getattr(T, name), n, k, threads, args.rounds, args.dense)
    print(
        f"{NUM_EXPERTS} experts, {threads} threads; wf_expert_matmul in place: float32 products"
        " (float) and integer ones on 8-bit activations (integer)"
        + ("; dense: kernels().matmul an expert (its decoded QuantMatrix)" if args.dense else "")
    )
    header = ["type", "NxK", "pairs/expert", "experts", "float ms", "GB/s", "integer ms", "GB/s"]
    if args.dense:
        header += ["dense ms", "GB/s"]
    if table:
        print_table([*header, "float/integer"], table)
    counts = [int(m) for m in args.vocab_rows.split(",") if m.strip() and int(m) > 0]
    if counts:
        print(
            f"\nthe vocabulary matrix {VOCAB[0]}x{VOCAB[1]} Q6_K as one expert, {threads} threads"
        )
        vocab_header = ["type", "NxK", "rows", "float ms", "GB/s", "integer ms", "GB/s"]
        print_table([*vocab_header, "float/integer"], vocab_rows(threads, args.rounds, counts))


if __name__ == "__main__":
    main()
