"""Decode speed by batch size and context length, this checkout against another one (e.g.
the commit before a change), measured alternately in one run.

    .venv/bin/python -m bench.engine_context [--baseline DIR] [--batches 1 8 16 32]
        [--contexts 128 2000] [--steps 32] [--threads N] [--device cpu|cuda] [--llamacpp]
        [--kv-dtypes float32 float16 q8_0]

Each configuration prefills `batch` distinct prompts of `context` tokens, then times
`steps` decode steps of the whole batch (aggregate tokens/s). With --baseline (a checkout
of another commit, e.g. `git worktree add /tmp/before HEAD~1`) each configuration runs
there and here one after the other, each in a fresh process, and the table gives both and
their ratio. With --llamacpp (llama-cpp-python installed: the `bench` extra) the batch-1
rows also give llama.cpp's single stream at the same context (the same prompt's tokens, the
same threads), in a fresh process too. With --kv-dtypes each configuration runs this
checkout once per KV dtype (--kv-dtype), one after the other, and the table gives each and
its ratio to the first (in place of --baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TEXT = (
    "The history of computing is a story of layers: each generation of engineers builds on "
    "the abstractions of the last, and the best of them remember what lies underneath. "
)


def measure(
    batch: int, context: int, steps: int, device: str = "cpu", kv_dtype: str = "auto"
) -> float:
    """Aggregate decode tokens/s of `batch` sequences `context` tokens deep (this checkout;
    `kv_dtype` only where it has --kv-dtype)."""
    from common.sampling import SamplingParams
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.model import Model
    from engine.sequence import Request
    from warmfleet.models import resolve_model

    kv = {} if kv_dtype == "auto" else {"kv_dtype": kv_dtype}
    model = Model.load(resolve_model(None), device=device, **kv)
    ids = model.tokenizer.encode(TEXT * (context // 20 + 40))
    config = EngineConfig(max_running=batch, prefill_chunk_tokens=2048, step_prefill_tokens=2048)
    engine = Engine(model, config)
    params = SamplingParams(max_tokens=steps + 2, ignore_eos=True, seed=1)
    for i in range(batch):  # distinct prompts: shifted by one token each
        engine.add(Request(f"d{i}", ids[i : i + context], params))
    while any(s.prefilling for s in engine.sequences.values()) or engine.scheduler.waiting:
        engine.step()
    engine.step()  # every sequence decoding from here
    t = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return batch * steps / (time.perf_counter() - t)


def measure_llamacpp(context: int, steps: int) -> float:
    """llama.cpp's single-stream decode tokens/s `context` tokens deep (one thread per core,
    or OMP_NUM_THREADS)."""
    from bench.llamacpp import decode_rate_at
    from engine.text.gguf_file import open_gguf, read_metadata
    from engine.text.tokenizer import Tokenizer
    from warmfleet.models import resolve_model

    path = resolve_model(None)
    tokenizer = Tokenizer.from_metadata(read_metadata(open_gguf(path)))
    ids = tokenizer.encode(TEXT * (context // 20 + 40))[:context]
    threads = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    return decode_rate_at(str(path), ids, steps, threads)


def run_in(
    checkout: Path,
    batch: int,
    context: int,
    steps: int,
    threads: int | None,
    device: str,
    kv_dtype: str = "auto",
) -> float:
    """measure() in a fresh process of `checkout`'s code (batch 0: measure_llamacpp())."""
    # this file's measure() (the other checkout may not have it) on that checkout's engine
    paths = [str(Path(__file__).resolve().parent), str(checkout), os.environ.get("PYTHONPATH")]
    env = dict(os.environ, PYTHONPATH=":".join(p for p in paths if p))
    if threads:
        env["NUMBA_NUM_THREADS"] = env["OMP_NUM_THREADS"] = str(threads)
    call = (f"measure({batch}, {context}, {steps}, {device!r}, {kv_dtype!r})" if batch
            else f"measure_llamacpp({context}, {steps})")  # fmt: skip
    imports = "from engine_context import measure, measure_llamacpp"
    code = f"import json; {imports}; print(json.dumps({call}))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=checkout, env=env, check=True, capture_output=True,
        text=True, timeout=1800,
    )  # fmt: skip
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", type=Path, help="a checkout of the code to compare with")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16, 32])
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 2000])
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--threads", type=int)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument(
        "--llamacpp", action="store_true", help="batch 1: llama.cpp's single stream there too"
    )
    p.add_argument("--kv-dtypes", nargs="+", choices=["float32", "float16", "q8_0"])
    args = p.parse_args(argv)
    if args.kv_dtypes and (args.baseline or args.llamacpp):
        p.error("--kv-dtypes compares dtypes in this checkout: not with --baseline or --llamacpp")
    from bench.table import print_table

    here = Path(__file__).resolve().parents[1]
    if args.kv_dtypes:
        print_table(*by_kv_dtype(here, args))
        return 0
    rows = []
    for context in args.contexts:
        for batch in args.batches:
            print(f"context {context}, batch {batch}", file=sys.stderr, flush=True)
            run = (batch, context, args.steps, args.threads, args.device)
            base = run_in(args.baseline, *run) if args.baseline else None
            now = run_in(here, *run)
            ours: tuple[str, ...] = (
                str(context), str(batch), f"{base:.1f}" if base else "-", f"{now:.1f}",
                f"{now / base:.2f}x" if base else "-",
            )  # fmt: skip
            if args.llamacpp:
                llama = run_in(here, 0, *run[1:]) if batch == 1 else None
                ours += (f"{llama:.1f}", f"{now / llama:.2f}x") if llama else ("-", "-")
            rows.append(ours)
    head: tuple[str, ...] = ("context", "batch", "baseline tok/s", "this tok/s", "ratio")
    if args.llamacpp:
        head += ("llama.cpp tok/s", "this / llama.cpp")
    print_table(head, rows)
    return 0


def by_kv_dtype(
    here: Path, args: argparse.Namespace
) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """Every configuration in each of args.kv_dtypes: the table's head and rows."""
    first, *others = args.kv_dtypes
    rows = []
    for context in args.contexts:
        for batch in args.batches:
            rates = {}
            for kv_dtype in args.kv_dtypes:
                print(
                    f"context {context}, batch {batch}, KV {kv_dtype}", file=sys.stderr, flush=True
                )
                rates[kv_dtype] = run_in(
                    here, batch, context, args.steps, args.threads, args.device, kv_dtype
                )
            cells = [str(context), str(batch), f"{rates[first]:.1f}"]
            for name in others:
                cells += [f"{rates[name]:.1f}", f"{rates[name] / rates[first]:.2f}x"]
            rows.append(tuple(cells))
    head = ["context", "batch", f"{first} tok/s"]
    for name in others:
        head += [f"{name} tok/s", f"{name} / {first}"]
    return tuple(head), rows


if __name__ == "__main__":
    raise SystemExit(main())
