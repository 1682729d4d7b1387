"""Sessions a warm budget holds, by KV dtype: one worker of the model with a warm budget
(default 1 GiB), sessions of --tokens prompt tokens each (distinct, so no block is shared)
opened one after another until the kvstore orders its first spill; how many were warm just
before, and the bytes each held, per --kv-dtypes, in one run.

    .venv/bin/python -m bench.kv_budget [--model PATH] [--tokens 2000] [--budget 1G]
        [--kv-dtypes float32 float16 q8_0]

Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import redis as redis_lib

from bench.table import print_table
from tests.cluster_helpers import settle
from warmfleet.client import Client, KVStoreClient
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster
from warmfleet.models import resolve_model
from warmfleet.sizes import parse_size

MAX_SESSIONS = 200  # a stop whatever the budget


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def warm_before_a_spill(
    path: Path, kv_dtype: str, budget: int, tokens: int
) -> tuple[int, int, float]:
    """(sessions warm before the first spill, bytes each held, sessions per GiB as the
    worker reports it) for one worker in `kv_dtype`."""
    rng = random.Random(0)
    with (
        tempfile.TemporaryDirectory(prefix="wf-kvbudget-") as spill,
        Cluster(
            ClusterConfig(
                num_workers=1,
                model=path,
                spill_dir=Path(spill),
                warm_budget=budget,
                kv_dtype=kv_dtype,
                progress=log,
            )
        ) as cluster,
        Client(cluster.target, timeout_s=600) as client,
        KVStoreClient(cluster.kvstore_target) as kv,
    ):
        r = redis_lib.Redis.from_url(cluster.redis_url, decode_responses=True)
        warm, held = 0, 0
        for i in range(MAX_SESSIONS):
            ids = [rng.randrange(100, 40000) for _ in range(tokens)]
            client.complete(f"b{i}", token_ids=ids, max_tokens=1, ignore_eos=True)
            usage = settle(r, kv)
            (worker,) = usage.workers
            if usage.counters.spills:
                break
            warm, held = worker.num_warm, worker.warm_bytes
            log(f"{kv_dtype}: {warm} sessions warm, {held / (1 << 20):.0f} MiB")
        r.close()
    per_session = held // max(1, warm)
    return warm, per_session, (1 << 30) / per_session if per_session else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", metavar="PATH")
    p.add_argument("--tokens", type=int, default=2000, help="prompt tokens a session holds")
    p.add_argument("--budget", default="1G", help="the worker's warm budget (default 1G)")
    p.add_argument(
        "--kv-dtypes",
        nargs="+",
        choices=["float32", "float16", "q8_0"],
        default=["float32", "float16", "q8_0"],
    )
    args = p.parse_args(argv)
    path, budget = resolve_model(args.model), parse_size(args.budget)
    rows = []
    for kv_dtype in args.kv_dtypes:
        warm, each, per_gib = warm_before_a_spill(path, kv_dtype, budget, args.tokens)
        rows.append((kv_dtype, str(warm), f"{each / (1 << 20):.1f}", f"{per_gib:.1f}"))
    print(f"Sessions of {args.tokens} tokens warm in a {args.budget} budget, by KV dtype")
    print_table(("KV dtype", "warm before a spill", "MiB a session", "sessions per GiB"), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
