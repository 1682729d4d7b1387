"""HTTP (the OpenAI API, streamed) against gRPC on the same requests, through one cluster:
time to first token and tokens per second at 1 and 16 clients.

    .venv/bin/python -m bench.http_vs_grpc [--requests 3] [--tokens 64] [--rounds 2]

Every request is the same prompt with 64 new tokens (`ignore_eos`), in a session of its own,
so both faces carry identical work to the workers, each client a thread with a blocking
client (grpc, httpx); the faces alternate in rounds and the
best round of each is kept (the machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable

import httpx

from bench.table import print_table
from warmfleet.client import Client
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster

MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def grpc_client(
    target: str, requests: int, tokens: int, out: list[tuple[float, int, float]]
) -> None:
    with Client(target, timeout_s=600) as c:
        for i in range(requests):
            start = time.perf_counter()
            first, n = 0.0, 0
            for r in c.stream(f"g-{time.time_ns()}-{i}", messages=MESSAGES, max_tokens=tokens,
                              ignore_eos=True):  # fmt: skip
                if r.HasField("chunk"):
                    if r.chunk.text:  # the first text, as the HTTP face counts it
                        first = first or time.perf_counter()
                    n += len(r.chunk.token_ids)
            out.append((first - start, n, time.perf_counter() - start))


def http_client(url: str, requests: int, tokens: int, out: list[tuple[float, int, float]]) -> None:
    # greedy, as the gRPC side (the face's default follows OpenAI's: temperature 1)
    body = {
        "messages": MESSAGES,
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    with httpx.Client(base_url=url, timeout=600) as c:
        for i in range(requests):
            start = time.perf_counter()
            first, n = 0.0, 0
            headers = {"X-Session-Id": f"h-{time.time_ns()}-{i}"}
            with c.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        data = json.loads(line[6:])
                        if data.get("usage"):
                            n = data["usage"]["completion_tokens"]
                        elif data["choices"] and data["choices"][0]["delta"].get("content"):
                            first = first or time.perf_counter()
            out.append((first - start, n, time.perf_counter() - start))


def run_clients(
    client: Callable[[str, int, int, list[tuple[float, int, float]]], None],
    target: str, clients: int, requests: int, tokens: int,
) -> dict[str, float]:  # fmt: skip
    """`clients` threads, each running `client` (the same shape for both faces)."""
    out: list[tuple[float, int, float]] = []
    threads = [threading.Thread(target=client, args=(target, requests, tokens, out))
               for _ in range(clients)]  # fmt: skip
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return summary(out, time.perf_counter() - t0)


def run_grpc(cluster: Cluster, clients: int, requests: int, tokens: int) -> dict[str, float]:
    return run_clients(grpc_client, cluster.target, clients, requests, tokens)


def run_http(cluster: Cluster, clients: int, requests: int, tokens: int) -> dict[str, float]:
    return run_clients(http_client, cluster.http_url, clients, requests, tokens)


def summary(out: list[tuple[float, int, float]], wall: float) -> dict[str, float]:
    return {"ttft": statistics.median(t for t, _, _ in out),
            "tok_s": sum(n for _, n, _ in out) / wall}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=3, help="requests per client")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    rows = []
    with Cluster(ClusterConfig(num_workers=1, progress=log)) as cluster:
        run_grpc(cluster, 1, 1, 8)  # warm both paths up
        run_http(cluster, 1, 1, 8)
        for clients in (1, 16):
            best: dict[str, dict[str, float]] = {}
            for r in range(args.rounds):
                for face, run in (("grpc", run_grpc), ("http", run_http)):
                    log(f"{clients} client(s), {face}, round {r + 1}")
                    got = run(cluster, clients, args.requests, args.tokens)
                    if face not in best or got["tok_s"] > best[face]["tok_s"]:
                        best[face] = got
            g, h = best["grpc"], best["http"]
            rows.append([f"{clients} client(s): time to first token (s)", f"{g['ttft']:.3f}",
                         f"{h['ttft']:.3f}", f"{h['ttft'] / g['ttft']:.3f}x"])  # fmt: skip
            rows.append([f"{clients} client(s): tokens per second", f"{g['tok_s']:.1f}",
                         f"{h['tok_s']:.1f}", f"{h['tok_s'] / g['tok_s']:.3f}x"])  # fmt: skip
    print_table(["figure", "gRPC", "HTTP (OpenAI, SSE)", "HTTP / gRPC"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
