"""warmfleet's C kernels against llama.cpp with both built for one CPU target, on this machine:
the figures issue 36 sets for CPUs without AVX-512.

    ISA=avx2 bench/build_llamacpp.sh
    WARMFLEET_MARCH=haswell OPENBLAS_CORETYPE=Haswell .venv/bin/python -m bench.cpu_targets \\
        --batched-bench ~/.cache/warmfleet/llamacpp-avx2/build/bin/llama-batched-bench \\
        [--model PATH] [--repeats R] [--threads 2]

WARMFLEET_MARCH builds the kernels for that target (engine/ops/native.py); OPENBLAS_CORETYPE
makes NumPy's OpenBLAS, which takes long prefill chunks where the kernels' vectors are not
single registers, run the kernels an AVX2 CPU would get. Without either the figures are this
CPU's own (AVX-512 here). Each round measures llama.cpp, then warmfleet; every figure is the
best of R rounds (and of PREFILL_RUNS prefills a round on each side):
- prefill: one prompt of --prefill-tokens tokens with nothing cached (llama-batched-bench's
  S_PP at batch 1; warmfleet's engine in one chunk, its first token included, after a
  prefill of another prompt, as each side warms up: bench.engine_measure.bench_prefill);
- decode: B prompts of 128 tokens, then 64 steps of all B, at batch 1 and 8 (llama.cpp:
  llama-batched-bench's S_TG, random tokens, no sampling; warmfleet: greedy, the prompts
  shifted windows of one text).
The table sets each figure against llama.cpp's and against the issue's target: single stream
0.8x, batch 8's aggregate 2.5x llama.cpp's single stream, prefill 2x.
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Mapping
from pathlib import Path

from bench.engine_measure import bench_decode, bench_prefill, make_workload
from bench.moe import BATCHED_BENCH, ROW, log, measure_llamacpp
from bench.table import print_table
from engine.device import set_threads
from engine.model import Model
from engine.ops import native
from warmfleet.models import resolve_model

Figures = dict[int | str, float]  # tok/s by batch size, and "prefill"
DECODE_BATCHES = [1, 8]
DECODE_PROMPT, DECODE_STEPS = 128, 64
PREFILL_RUNS = 5  # prefills a round, each side: a noisy machine's best of few is a lottery
# (figure, warmfleet's key, llama.cpp's key, target ratio)
FIGURES = (
    ("prefill", "prefill", "prefill", 2.0),
    ("decode, batch 1", 1, 1, 0.8),
    ("decode, batch 8 (aggregate)", 8, 1, 2.5),
)


def llamacpp_prefill(binary: Path, model: Path, tokens: int, threads: int) -> float:
    """llama.cpp's prefill of one `tokens`-token prompt (tok/s: S_PP of batch 1), the best
    of PREFILL_RUNS."""
    cmd = [str(binary), "-m", str(model), "-c", str(tokens + 8), "-t", str(threads), "-ngl", "0"]
    cmd += ["-npp", str(tokens), "-ntg", "1", "-npl", ",".join(["1"] * PREFILL_RUNS)]
    log(" ".join(cmd))
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    out = run.stdout + run.stderr
    rows = [m for line in out.splitlines() if (m := ROW.match(line.strip()))]
    if run.returncode or not rows:
        raise SystemExit(f"llama-batched-bench failed ({run.returncode}):\n{out[-3000:]}")
    return max(float(row.group(6)) for row in rows)


def warmfleet(model: Path, prefill_tokens: int, threads: int) -> Figures:
    """warmfleet's prefill (the best of PREFILL_RUNS) and decode figures (tok/s, each the
    best of two)."""
    set_threads(threads)
    loaded = Model.load(model)
    text = make_workload(loaded, max(prefill_tokens, DECODE_PROMPT + 8), 1, (1,)).prompt_ids
    figures: Figures = {"prefill": bench_prefill(loaded, text[:prefill_tokens], PREFILL_RUNS)}
    for b in DECODE_BATCHES:
        log(f"warmfleet: batch {b}")
        figures[b] = bench_decode(loaded, text, b, DECODE_STEPS, 2, DECODE_PROMPT)
    return figures


def rounds(args: argparse.Namespace, model: Path) -> tuple[Figures, Figures]:
    """warmfleet's and llama.cpp's best figures over --repeats rounds taken in turn."""
    ours: Figures = {}
    theirs: Figures = {}

    def keep(into: Figures, got: Mapping[int, float] | Mapping[str, float] | Figures) -> None:
        for k, v in got.items():
            into[k] = max(v, into.get(k, 0.0))

    for r in range(args.repeats):
        log(f"round {r + 1} of {args.repeats}")
        work = (DECODE_BATCHES, DECODE_PROMPT, DECODE_STEPS, args.threads)
        keep(theirs, measure_llamacpp(args.batched_bench, model, *work))
        prefill = llamacpp_prefill(args.batched_bench, model, args.prefill_tokens, args.threads)
        keep(theirs, {"prefill": prefill})
        keep(ours, warmfleet(model, args.prefill_tokens, args.threads))
    return ours, theirs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", metavar="PATH", help="GGUF file (default: the default model)")
    p.add_argument("--batched-bench", type=Path, default=BATCHED_BENCH, metavar="PATH")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefill-tokens", type=int, default=512)
    args = p.parse_args(argv)
    if not args.batched_bench.exists():
        raise SystemExit(f"{args.batched_bench} is missing: run bench/build_llamacpp.sh")
    model = resolve_model(args.model)
    log(f"warmfleet's kernels: -march={native.march()} ({native.isa()})")
    ours, theirs = rounds(args, model)
    rows = []
    for name, key, their_key, target in FIGURES:
        ratio = ours[key] / theirs[their_key]
        verdict = f"{target:.1f}x " + ("met" if ratio >= target else "missed")
        figures = [f"{ours[key]:.1f}", f"{theirs[their_key]:.1f}", f"{ratio:.2f}x"]
        rows.append([name, *figures, verdict])
    log(f"{model.name}: {args.threads} threads, best of {args.repeats} rounds")
    heads = ["figure (tok/s)", "warmfleet", "llama.cpp", "ratio", "target"]
    print_table(heads, rows)
    print("(batch 8's ratio is against llama.cpp's single stream)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
