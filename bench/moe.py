"""Batched decode of a mixture-of-experts model (or any model), warmfleet against llama.cpp
on the same file:

    .venv/bin/python -m bench.random_model qwen3-30b-a3b \\
        ~/.cache/warmfleet/models/qwen3-30b-a3b-8L-q4_k_m.gguf --type q4_k_m --no-check
    .venv/bin/python -m bench.moe --model ~/.cache/warmfleet/models/qwen3-30b-a3b-8L-q4_k_m.gguf
        [--batches 1,8,32] [--threads 2] [--prompt-tokens 128] [--decode-steps 64]
        [--repeats R] [--batched-bench PATH] [--no-warmfleet] [--no-llamacpp]

llama.cpp: `llama-batched-bench -m FILE -c C -npp 128 -ntg 64 -npl 1,8,32 -t 2 -ngl 0`
(built by bench/build_llamacpp.sh; C = the largest batch x (128 + 64), as it skips a batch
whose sequences do not fit): B random prompts of 128 tokens, then 64 steps each decoding one
token of all B; its S_TG column (B x 64 / the steps' time) is the decode aggregate.
warmfleet (measure_warmfleet): the same on the engine in this process, B prompts of 128
random tokens, then 64 timed steps of the whole batch, each sequence sampling at temperature
100 among its top 1,000 tokens with a seed of its own (top-k keeps the sampler from sorting
the whole vocabulary): near-uniform tokens, as llama-batched-bench's random ones, so
that neither side's rows route alike for sharing a text (a text's rows route alike, and
fewer experts are touched). The table gives both and the
ratio per batch; with --repeats each figure is the best of R rounds, the two sides taking
turns. With random routers (bench.random_model) tokens route near-uniformly, as random tokens
do in llama.cpp: an MoE step of B rows touches about E(1 - (1 - k/E)^B) experts.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.moe_reads import StepReads, counts, step_reads
from bench.table import print_table
from common.errors import UnsupportedModelError
from common.sampling import SamplingParams
from engine.config import EngineConfig
from engine.device import set_threads
from engine.engine import Engine
from engine.model import Model
from engine.sequence import Request
from warmfleet.doctor_bench import read_bandwidth_gbs

BATCHED_BENCH = Path.home() / ".cache/warmfleet/llamacpp/build/bin/llama-batched-bench"
# a row of llama-batched-bench's table: | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s |
# S_TG t/s | T s | S t/s |
ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|" + r"\s*([\d.]+)\s*\|" * 7 + "$")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_batched_bench(out: str) -> dict[int, float]:
    """llama-batched-bench's decode aggregate (S_TG, tok/s) by batch size, from its table."""
    rates: dict[int, float] = {}
    for line in out.splitlines():
        if m := ROW.match(line.strip()):
            rates[int(m.group(3))] = float(m.group(8))
    return rates


def best(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
    """The higher rate of two rounds, by batch size."""
    return {k: max(v, a.get(k, 0.0)) for k, v in b.items()}


def measure_llamacpp(
    binary: Path,
    model: Path,
    batches: list[int],
    prompt_tokens: int = 128,
    steps: int = 64,
    threads: int = 2,
    repeats: int = 1,
) -> dict[int, float]:
    """llama.cpp's decode tokens/s (all B sequences together) by batch size, the best of
    `repeats` runs of llama-batched-bench."""
    rates: dict[int, float] = {}
    for _ in range(repeats):
        rates = best(rates, _batched_bench(binary, model, batches, prompt_tokens, steps, threads))
    return rates


def _batched_bench(
    binary: Path, model: Path, batches: list[int], prompt_tokens: int, steps: int, threads: int
) -> dict[int, float]:
    """One run of llama-batched-bench: its decode aggregate by batch size."""
    context = max(batches) * (prompt_tokens + steps)  # its sequences, none shared
    cmd = [str(binary), "-m", str(model), "-c", str(context), "-t", str(threads), "-ngl", "0"]
    cmd += ["-npp", str(prompt_tokens), "-ntg", str(steps), "-npl", ",".join(map(str, batches))]
    log(" ".join(cmd))
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if run.returncode:
        raise SystemExit(f"llama-batched-bench failed ({run.returncode}):\n{run.stderr[-3000:]}")
    out = run.stdout + run.stderr
    log("\n".join(line for line in out.splitlines() if line.startswith(("|", "main:"))))
    rates = parse_batched_bench(out)
    if missing := sorted(set(batches) - set(rates)):
        raise SystemExit(f"llama-batched-bench gave no row for batch {missing}:\n{run.stdout}")
    return rates


# ---- warmfleet's side ----------------------------------------------------------------------
def measure_warmfleet(
    model: Path,
    batches: list[int],
    prompt_tokens: int = 128,
    steps: int = 64,
    threads: int = 2,
    repeats: int = 1,
    reads: dict[int, StepReads] | None = None,
) -> dict[int, float]:
    """warmfleet's decode tokens/s by batch size on `model`: for each B, B distinct prompts of
    `prompt_tokens` tokens prefilled, then `steps` steps of all B timed (B x steps / time),
    the best of `repeats` rounds; what a step read put in `reads` where given (MoE models)."""
    set_threads(threads)
    loaded = Model.load(model)
    rng = np.random.default_rng(0)
    _decode(loaded, [[1, 2, 3]], 2)  # untimed: a first use builds the kernels
    rates = {}
    for b in batches:
        log(f"warmfleet: batch {b}")
        vocab = loaded.config.vocab_size
        prompts = [rng.integers(0, vocab, prompt_tokens).tolist() for _ in range(b)]
        seconds = min(_decode(loaded, prompts, steps, reads, b) for _ in range(repeats))
        rates[b] = b * steps / seconds
    return rates


def _decode(
    model: Model,
    prompts: list[list[int]],
    steps: int,
    reads: dict[int, StepReads] | None = None,
    key: int = 0,
) -> float:
    """Seconds of `steps` decode steps of all `prompts` together, after their prefill and a
    first decode step (neither timed); what the timed steps read into reads[key]."""
    longest = max(map(len, prompts))
    config = EngineConfig(
        max_running=len(prompts),
        prefill_chunk_tokens=2048,
        step_prefill_tokens=2048,
        session_budget_bytes=0,
        kv_pool_bytes=len(prompts) * (longest + steps + 48) * model.bytes_per_token,
    )
    engine = Engine(model, config)
    for i, ids in enumerate(prompts):
        params = SamplingParams(
            temperature=100.0, top_k=1000, max_tokens=steps + 2, ignore_eos=True, seed=i
        )
        engine.add(Request(f"d{i}", ids, params))
    while any(s.prefilling for s in engine.sequences.values()) or engine.scheduler.waiting:
        engine.step()
    engine.step()  # every sequence decoding from here
    stats = counts(model)
    before = None if stats is None else stats.copy()
    t = time.perf_counter()
    for _ in range(steps):
        engine.step()
    seconds = time.perf_counter() - t
    if reads is not None and stats is not None and before is not None:
        reads[key] = step_reads(model, before, stats, steps)
    return seconds


# ---- the table -----------------------------------------------------------------------------
def ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}x" if ours and theirs else "-"


def rate(value: float | None) -> str:
    return f"{value:.1f}" if value else "-"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, required=True, metavar="FILE")
    p.add_argument("--batches", default="1,8,32", metavar="B[,...]")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--decode-steps", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1, help="each figure the best of R rounds")
    p.add_argument("--batched-bench", type=Path, default=BATCHED_BENCH, metavar="PATH")
    p.add_argument("--no-warmfleet", action="store_true")
    p.add_argument("--no-llamacpp", action="store_true")
    return p.parse_args(argv)


def run_rounds(
    args: argparse.Namespace, batches: list[int], reads: dict[int, StepReads]
) -> tuple[dict[int, float], dict[int, float]]:
    """warmfleet's and llama.cpp's best rates by batch size over --repeats rounds taken in
    turn, so that a slow minute on a shared machine slows both sides alike."""
    work = (batches, args.prompt_tokens, args.decode_steps, args.threads)
    ours: dict[int, float] = {}
    theirs: dict[int, float] = {}
    use_ours, use_theirs = not args.no_warmfleet, not args.no_llamacpp
    for _ in range(args.repeats):
        if use_theirs:
            theirs = best(theirs, measure_llamacpp(args.batched_bench, args.model, *work))
        if use_ours:
            try:
                ours = best(ours, measure_warmfleet(args.model, *work, 1, reads))
            except UnsupportedModelError as e:
                log(f"warmfleet cannot load {args.model.name}: {e}")
                use_ours = False
    return ours, theirs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    batches = sorted({int(b) for b in args.batches.split(",")})
    if not args.no_llamacpp and not args.batched_bench.exists():
        raise SystemExit(f"{args.batched_bench} is missing: run bench/build_llamacpp.sh")
    reads: dict[int, StepReads] = {}
    ours, theirs = run_rounds(args, batches, reads)
    rows = [
        [str(b), rate(ours.get(b)), rate(theirs.get(b)), ratio(ours.get(b), theirs.get(b))]
        for b in batches
    ]
    log(f"{args.model.name}: {args.threads} threads, {args.prompt_tokens}-token prompts")
    print_table(["batch", "warmfleet tok/s", "llama.cpp tok/s", "warmfleet / llama.cpp"], rows)
    if reads:
        print_reads(reads, ours, read_bandwidth_gbs())
    return 0


def print_reads(reads: dict[int, StepReads], ours: dict[int, float], read_gbs: float) -> None:
    """Per batch: experts a layer touched, MB a step read, its floor at the read bandwidth and
    warmfleet's step time."""
    print(f"\nwhat a step reads (read bandwidth {read_gbs:.1f} GB/s):")
    rows = []
    for b, r in sorted(reads.items()):
        step_ms = b / ours[b] * 1e3 if ours.get(b) else 0.0
        mb = f"{r.total_bytes / 1e6:.0f} ({r.expert_bytes / 1e6:.0f} experts)"
        floor = r.floor_ms(read_gbs)
        share = f"{floor / step_ms:.2f}" if step_ms else "-"
        rows.append(
            [str(b), f"{r.experts_per_layer:.1f}", mb, f"{floor:.1f}", f"{step_ms:.1f}", share]
        )
    heads = ["batch", "experts / layer", "MB / step", "floor ms", "step ms", "floor / step"]
    print_table(heads, rows)


if __name__ == "__main__":
    raise SystemExit(main())
