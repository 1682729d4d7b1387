"""KV tiers: time to first token when a session of about --context tokens resumes warm (KV in
the worker's pool), from its spill file on disk, and recomputed (a new session id, same
prompt); and the spill files' write and restore throughput.

    .venv/bin/python -m bench.kv_tiers [--model PATH] [--context 2000] [--repeats 3]
        [--turn chat|continue] [--kv-dtypes float32 float16 q8_0]

One worker with every core. Its warm budget holds one such session but not two, so running a
second session of the same size pushes the first one to disk. The page cache is dropped
before every disk read where the machine allows it (as root: /proc/sys/vm/drop_caches; else
posix_fadvise(DONTNEED) on the spill files); the output says which. Figures are medians of
--repeats; ratios are taken within the run. Progress goes to stderr, the tables to stdout.

The resuming turn is, with `--turn chat` (the default), a short question after the session's
log: its ~17 new tokens are computed in every tier, so their cost is in every figure. With
`--turn continue` it is the session's token ids so far (its prompt and replies) and nothing
new: the resume alone, from the KV's tier to the first sampled token.

Each of --kv-dtypes (the workers' --kv-dtype; default all three) runs it all in
turn, with a warm budget of the same number of sessions; a last table sets each path's time
in every dtype against the first's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.kv_tiers_disk import spill_throughput
from bench.kv_tiers_session import (
    MAX_TOKENS,
    SOURCE_NAMES,
    Encode,
    Messages,
    Turn,
    log,
    long_text,
    run_repeat,
    turn,
)
from bench.table import print_table
from engine.kv.kv_pool import BLOCK_TOKENS
from engine.kv_files.kv_dtypes import kv_dtype_named, token_bytes
from engine.text.chat import render_chat
from engine.text.gguf_file import open_gguf, read_metadata
from engine.text.model_config import ModelConfig
from engine.text.tokenizer import Tokenizer
from warmfleet.client import Client
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster
from warmfleet.models import resolve_model

SOURCE_KINDS = ("warm", "disk", "recompute")
Results = list[dict[str, Turn]]  # one per repeat: the "warm", "disk" and "recompute" turns


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", metavar="PATH")
    parser.add_argument("--context", type=int, default=2000, help="tokens of the resumed prompt")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--turn",
        choices=("chat", "continue"),
        default="chat",
        help="the resuming turn: a short question, or the session so far and nothing new",
    )
    parser.add_argument(
        "--kv-dtypes",
        nargs="+",
        choices=("float32", "float16", "q8_0"),
        default=["float32", "float16", "q8_0"],
        help="the workers' KV dtypes, each measured in turn",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    path = resolve_model(args.model)
    meta = read_metadata(open_gguf(path))
    config, tokenizer = ModelConfig.from_metadata(meta), Tokenizer.from_metadata(meta)
    assert tokenizer.chat_template is not None, "the model has no chat template"
    text = long_text(tokenizer, tokenizer.chat_template, args.context)
    template = tokenizer.chat_template

    def rendered(messages: Messages) -> list[int]:
        return tokenizer.encode(render_chat(template, messages))

    encode: Encode | None = rendered if args.turn == "continue" else None
    threads = os.cpu_count() or 1
    by_dtype: dict[str, Results] = {}
    for kv_dtype in args.kv_dtypes:
        dtype = kv_dtype_named(kv_dtype)
        log(f"{kv_dtype} KV: spill files, {args.repeats} x write and read of {args.context} tokens")
        io_rows, io_methods = spill_throughput(config, args.context, args.repeats, dtype)
        budget = warm_budget(config, args.context, dtype)
        methods: set[str] = set()
        resident: list[int] = []
        results = run_sessions(
            path, threads, budget, text, args.repeats, encode, methods, resident, kv_dtype
        )
        by_dtype[kv_dtype] = results
        print(f"KV {kv_dtype}; resuming turn: {args.turn}")
        print_resume_table(results, threads, args.repeats, methods, resident)
        print()
        print(
            f"Spill files, one {args.context}-token {kv_dtype} KV, median of {args.repeats}; "
            f"page cache: {', '.join(sorted(io_methods))}"
        )
        print_table(("operation", "MB", "time (ms)", "MB/s"), io_rows)
        print()
        print_targets(results)
        print()
    if len(by_dtype) > 1:
        print_dtype_table(by_dtype, args.repeats)


def print_dtype_table(by_dtype: dict[str, Results], repeats: int) -> None:
    """Each path's median time to first token in every KV dtype, against the first's."""
    first = next(iter(by_dtype))
    base = {k: statistics.median(pick(by_dtype[first], k, "ttft_s")) for k in SOURCE_KINDS}
    rows = []
    for kind in SOURCE_KINDS:
        cells = [kind]
        for name, results in by_dtype.items():
            ttft = statistics.median(pick(results, kind, "ttft_s"))
            cells.append(f"{ttft * 1e3:.1f}")
            if name != first:
                cells.append(f"{base[kind] / ttft:.2f}x")
        rows.append(tuple(cells))
    head = ["path"]
    for name in by_dtype:
        head.append(f"{name} TTFT (ms)")
        if name != first:
            head.append(f"{first} / {name}")
    print(f"Time to first token on resume by KV dtype, median of {repeats}")
    print_table(tuple(head), rows)


def warm_budget(config: ModelConfig, context: int, dtype: np.dtype[Any]) -> int:
    """A warm budget that holds one session of `context` tokens (plus the reply) but not two."""
    c = config
    per_token = token_bytes(c.num_layers, c.num_kv_heads, c.head_dim, dtype)
    capacity = -(-(context + MAX_TOKENS) // BLOCK_TOKENS) * BLOCK_TOKENS
    session_bytes = capacity * per_token
    budget = 3 * session_bytes // 2  # one session fits, two do not
    log(
        f"KV: {per_token} bytes/token; a {context}-token session holds {capacity} "
        f"positions = {session_bytes / (1 << 20):.1f} MiB; warm budget {budget / (1 << 20):.1f} MiB"
    )
    return budget


def run_sessions(
    path: Path,
    threads: int,
    budget: int,
    text: str,
    repeats: int,
    encode: Encode | None,
    methods: set[str],
    resident: list[int],
    kv_dtype: str,
) -> Results:
    """Start one worker with `threads` threads, warm budget `budget` and `kv_dtype` KV, and
    run `repeats` repeats of the conversation over `text`, its turns sent as `encode` makes
    them (kv_tiers_session.send); the spill folder is removed afterwards."""
    spill_dir = Path(tempfile.mkdtemp(prefix="wf-kvtiers-spill-"))
    results: Results = []
    try:
        with (
            Cluster(
                ClusterConfig(
                    num_workers=1,
                    model=path,
                    threads_per_worker=threads,
                    progress=log,
                    log_dir=os.environ.get("WARMFLEET_BENCH_LOGS") or None,
                    spill_dir=spill_dir,
                    warm_budget=budget,
                    kv_dtype=kv_dtype,
                )
            ) as cluster,
            Client(cluster.target, timeout_s=600) as client,
        ):
            warmup = [{"role": "user", "content": "Hello."}]
            # first-call costs (Numba, gRPC) out of the way
            turn(client, "kvt-warmup", messages=warmup)
            client.delete_session("kvt-warmup")
            for r in range(repeats):
                results.append(run_repeat(client, r, text, spill_dir, encode, methods, resident))
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)
    return results


def pick(results: Results, kind: str, attr: str) -> list[float]:
    """`attr` of the `kind` turn in every repeat."""
    return [float(getattr(r[kind], attr)) for r in results]


def ms(values: Sequence[float]) -> str:
    """The median of `values` (seconds) in milliseconds, to 0.1."""
    return f"{statistics.median(values) * 1e3:.1f}"


def print_resume_table(
    results: Results, threads: int, repeats: int, methods: set[str], resident: list[int]
) -> None:
    """Time to first token of the warm, disk and recomputed resumes, against recompute."""
    rec = statistics.median(pick(results, "recompute", "ttft_s"))
    rows = []
    for kind in SOURCE_KINDS:
        ttft = pick(results, kind, "ttft_s")
        rows.append(
            (
                kind,
                SOURCE_NAMES[results[0][kind].source],
                f"{results[0][kind].prompt_tokens}",
                f"{results[0][kind].cached_tokens}",
                ms(ttft),
                f"{min(ttft) * 1e3:.1f}-{max(ttft) * 1e3:.1f}",
                ms(pick(results, kind, "client_ttft_s")),
                f"{rec / statistics.median(ttft):.1f}x",
            )
        )
    print(
        f"Time to first token on resume, 1 worker with {threads} threads, "
        f"median of {repeats}; page cache before the disk resume: {', '.join(sorted(methods))}"
        + (f" (spill files resident after the drop: max {max(resident)} bytes)" if resident else "")
    )
    print_table(
        (
            "path",
            "kv_source",
            "prompt tokens",
            "cached",
            "TTFT (ms)",
            "min-max (ms)",
            "client TTFT (ms)",
            "recompute / this",
        ),
        rows,
    )


def print_targets(results: Results) -> None:
    """Whether the warm and disk resumes meet their speed targets against recompute."""
    rec = statistics.median(pick(results, "recompute", "ttft_s"))
    warm, disk = (
        statistics.median(pick(results, "warm", "ttft_s")),
        statistics.median(pick(results, "disk", "ttft_s")),
    )
    slowest_disk = max(pick(results, "disk", "ttft_s"))
    fastest_recompute = min(pick(results, "recompute", "ttft_s"))
    print_table(
        ("target", "result", "holds"),
        [
            ("warm >= 100x faster than recompute", f"{rec / warm:.1f}x", _yes(rec / warm >= 100)),
            ("disk >= 20x faster than recompute", f"{rec / disk:.1f}x", _yes(rec / disk >= 20)),
            (
                "disk never slower than recompute",
                f"slowest disk {slowest_disk * 1e3:.0f} ms, fastest recompute "
                f"{fastest_recompute * 1e3:.0f} ms",
                _yes(slowest_disk < fastest_recompute),
            ),
        ],
    )


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


if __name__ == "__main__":
    main()
