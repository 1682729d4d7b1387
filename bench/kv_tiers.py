"""KV tiers: time to first token when a session of about --context tokens resumes warm (KV in
the worker's pool), from its spill file on disk, and recomputed (a new session id, same
prompt); and the spill files' write and restore throughput.

    .venv/bin/python -m bench.kv_tiers [--model PATH] [--context 2000] [--repeats 3]
        [--turn chat|continue] [--kv-dtypes float32 float16 q8_0] [--keep-blocks]

One worker with every core. Its warm budget holds one such session but not two, so running a
second session of the same size pushes the first one to disk. The page cache is dropped
before every disk read where the machine allows it (as root: /proc/sys/vm/drop_caches; else
posix_fadvise(DONTNEED) on the spill files); the output says which. Figures are medians of
--repeats; ratios are taken within the run. Progress goes to stderr, the tables to stdout.

The resuming turn is, with `--turn chat` (the default), a short question after the session's
log: its ~17 new tokens are computed in every tier, so their cost is in every figure. With
`--turn continue` it is the session's token ids so far (its prompt and replies) and nothing
new: the resume alone, from the KV's tier to the first sampled token.

A session's blocks stay known by the worker's pool when it goes to disk (until their room is
needed), and a resume takes those instead of reading their files: before the disk resume a
session of A's first turn takes them and is deleted, which makes the pool forget them, so
that the disk figures are reads from the files; --keep-blocks leaves them, to measure that
case (the resume then reads only the session's own file).

Each of --kv-dtypes (the workers' --kv-dtype; default all three) runs it all in
turn, with a warm budget of the same number of sessions; a last table sets each path's time
in every dtype against the first's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.kv_tiers_disk import spill_throughput
from bench.kv_tiers_report import Results, print_dtype_table, print_resume_table, print_targets
from bench.kv_tiers_session import (
    MAX_TOKENS,
    Encode,
    Messages,
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
    parser.add_argument(
        "--keep-blocks",
        action="store_true",
        help="resume from disk with the session's blocks still known by the worker's pool "
        "(released when it went to disk: the resume takes them instead of reading them); "
        "by default the pool is made to forget them first",
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
            path,
            threads,
            budget,
            text,
            args.repeats,
            encode,
            methods,
            resident,
            kv_dtype,
            args.keep_blocks,
        )
        by_dtype[kv_dtype] = results
        blocks = "kept by the pool" if args.keep_blocks else "read from the files"
        print(f"KV {kv_dtype}; resuming turn: {args.turn}; the disk resume's blocks: {blocks}")
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
    keep_blocks: bool,
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
                results.append(
                    run_repeat(client, r, text, spill_dir, encode, methods, resident, keep_blocks)
                )
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)
    return results


if __name__ == "__main__":
    main()
