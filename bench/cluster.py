"""Cluster overhead: the same greedy requests through the in-process engine and through the
whole system (gateway, Redis, one worker process), and dispatch latency.

    .venv/bin/python -m bench.cluster [--model PATH] [--tokens 128] [--repeats 3]

Both sides use every core (the worker gets them all while the engine side is idle). Prints a
table; ratios are taken within the run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from bench.table import print_table
from common.sampling import SamplingParams
from engine.device import set_threads
from engine.engine import Engine
from engine.model import Model
from engine.sequence import Request
from warmfleet.client import Client
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster
from warmfleet.models import resolve_model

PROMPTS = [
    "Once upon a time, in a small village by the sea,",
    "The history of the printing press begins",
    "def parse_config(path):\n    ",
    "In the beginning of the twentieth century, physicists",
    "The recipe calls for three cups of flour,",
    "A short guide to distributed systems: first,",
    "Dear diary, today I finally",
    "The mountain trail was steep and",
]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def engine_run(
    model: Model, prompts: list[list[int]], tokens: int
) -> tuple[float, list[list[int]]]:
    engine = Engine(model)
    requests = [
        Request(f"r{i}", p, SamplingParams(max_tokens=tokens)) for i, p in enumerate(prompts)
    ]
    t = time.perf_counter()
    out = engine.generate(requests)
    wall = time.perf_counter() - t
    return wall, [[t for o in out[r.request_id] for t in o.token_ids] for r in requests]


def cluster_run(
    client: Client, prompts: list[list[int]], tokens: int
) -> tuple[float, list[list[int]], list[float]]:
    ids: list[list[int]] = [[] for _ in prompts]
    waits: list[float] = [0.0] * len(prompts)

    def one(i: int) -> None:
        reply = client.complete(
            f"bench-{i}-{time.monotonic_ns()}", token_ids=prompts[i], max_tokens=tokens
        )
        ids[i], waits[i] = reply.token_ids, reply.completion.timings.queue_wait_s

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t, ids, waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", metavar="PATH")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dispatch-samples", type=int, default=100)
    args = parser.parse_args()
    threads = set_threads(None)
    path = resolve_model(args.model)
    model = Model.load(path, device="cpu")
    prompts = [model.tokenizer.encode(p) for p in PROMPTS]
    rows = []
    with (
        Cluster(
            ClusterConfig(num_workers=1, model=path, threads_per_worker=threads, progress=log)
        ) as cluster,
        Client(cluster.target, timeout_s=600) as client,
    ):
        cluster_run(client, prompts[:1], 4)  # warm up the path
        for clients in (1, 8):
            batch = prompts[:clients]
            log(f"{clients} client(s): engine, then cluster, {args.repeats} times")
            e_best = c_best = float("inf")
            for _ in range(args.repeats):
                e_wall, e_ids = engine_run(model, batch, args.tokens)
                c_wall, c_ids, _ = cluster_run(client, batch, args.tokens)
                assert c_ids == e_ids, "the cluster's tokens differ from the engine's"
                e_best, c_best = min(e_best, e_wall), min(c_best, c_wall)
            n = sum(len(i) for i in e_ids)
            rows.append(
                (
                    f"{clients} client(s), {n} tokens: end to end (s)",
                    f"{e_best:.2f}",
                    f"{c_best:.2f}",
                    f"{c_best / e_best:.3f}x",
                )
            )
        log(f"dispatch latency: {args.dispatch_samples} one-token requests on an idle worker")
        waits = []
        for _ in range(args.dispatch_samples):
            waits += cluster_run(client, prompts[:1], 1)[2]
    waits.sort()
    p50, p99 = statistics.median(waits), waits[int(0.99 * (len(waits) - 1))]
    rows.append(("dispatch enqueue -> admission p50 (ms)", "-", f"{p50 * 1e3:.2f}", "-"))
    rows.append(("dispatch enqueue -> admission p99 (ms)", "-", f"{p99 * 1e3:.2f}", "-"))
    print_table(("figure", "engine", "cluster", "cluster/engine"), rows)


if __name__ == "__main__":
    main()
