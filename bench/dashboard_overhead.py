"""What watching costs: decode throughput with the dashboard open (its event stream read by
a client) and every part's /metrics scraped once a second, against neither, in alternating
rounds on one cluster.

    .venv/bin/python -m bench.dashboard_overhead [--model PATH] [--rounds 6] [--sessions 8]

Each round sends the same greedy requests (one per session, all at once, --tokens each,
ignore_eos) and measures generated tokens per wall-clock second; rounds alternate between
the two conditions so that the machine's drift falls on both. Prints a table; the ratio is
taken within the run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from bench.cluster import PROMPTS
from bench.table import print_table
from warmfleet.client import Client
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster
from warmfleet.models import resolve_model

SCRAPE_INTERVAL_S = 1.0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Watchers:
    """A dashboard's event stream read as it comes, and Prometheus's scrapes of every part."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.stop = threading.Event()
        self.updates = 0
        self.scrapes = 0
        self._threads = [
            threading.Thread(target=f, daemon=True) for f in (self._watch, self._scrape)
        ]

    def __enter__(self) -> Watchers:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=10)

    def _watch(self) -> None:
        url = f"{self.cluster.http_url}/dashboard/events"
        with httpx.stream("GET", url, timeout=30) as r:
            for line in r.iter_lines():
                self.updates += line.startswith("data:")
                if self.stop.is_set():
                    return

    def _scrape(self) -> None:
        parts = ["gateway", "kvstore", *self.cluster.worker_ids]
        with httpx.Client(timeout=10) as http:
            while not self.stop.wait(SCRAPE_INTERVAL_S):
                for part in parts:
                    http.get(self.cluster.metrics_url(part)).raise_for_status()
                    self.scrapes += 1


def cpu_seconds(cluster: Cluster) -> dict[str, float]:
    """User + system CPU seconds each part has used so far (Linux: /proc/PID/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    used = {}
    for name, process in cluster.processes.items():
        with open(f"/proc/{process.pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        used[name] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return used


def one_round(client: Client, sessions: int, tokens: int, tag: str) -> float:
    """Generated tokens per second for `sessions` requests at once."""

    def run(i: int) -> int:
        prompt = PROMPTS[i % len(PROMPTS)]
        reply = client.complete(f"{tag}-{i}", prompt=prompt, max_tokens=tokens, temperature=0.0,
                                ignore_eos=True)  # fmt: skip
        return len(reply.token_ids)

    t = time.perf_counter()
    with ThreadPoolExecutor(sessions) as pool:
        generated = sum(pool.map(run, range(sessions)))
    return generated / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="GGUF file (default: the default model)")
    ap.add_argument("--rounds", type=int, default=6, help="rounds of each condition (6)")
    ap.add_argument("--sessions", type=int, default=8, help="requests at once (8)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per request (64)")
    ap.add_argument("--workers", type=int, default=1, help="worker processes (1)")
    args = ap.parse_args()
    config = ClusterConfig(num_workers=args.workers, model=resolve_model(args.model))
    rates: dict[str, list[float]] = {"neither": [], "watched": []}
    cpu: dict[str, dict[str, float]] = {"neither": {}, "watched": {}}  # part: CPU s / s
    with Cluster(config) as cluster, Client(cluster.target, timeout_s=600) as client:
        one_round(client, args.sessions, args.tokens, "warm-up")
        for i in range(args.rounds):
            for condition in ("neither", "watched") if i % 2 == 0 else ("watched", "neither"):
                tag, used, t = f"{condition}-{i}", cpu_seconds(cluster), time.perf_counter()
                if condition == "watched":
                    with Watchers(cluster) as w:
                        rate = one_round(client, args.sessions, args.tokens, tag)
                    log(f"round {i} watched: {rate:.1f} tok/s ({w.updates} updates, "
                        f"{w.scrapes} scrapes)")  # fmt: skip
                else:
                    rate = one_round(client, args.sessions, args.tokens, tag)
                    log(f"round {i} neither: {rate:.1f} tok/s")
                rates[condition].append(rate)
                took, after = time.perf_counter() - t, cpu_seconds(cluster)
                for part, s in after.items():
                    spent = cpu[condition].get(part, 0.0) + (s - used[part]) / took
                    cpu[condition][part] = spent
    report(args, rates, cpu)


def report(
    args: argparse.Namespace, rates: dict[str, list[float]], cpu: dict[str, dict[str, float]]
) -> None:
    base = statistics.median(rates["neither"])
    pairs = [w / n for w, n in zip(rates["watched"], rates["neither"], strict=True)]
    rows = [
        [name, f"{statistics.median(r):.1f}", f"{min(r):.1f}-{max(r):.1f}",
         f"{statistics.median(r) / base:.3f}"]
        for name, r in rates.items()
    ]  # fmt: skip
    print(f"decode throughput, {args.sessions} sessions x {args.tokens} tokens, "
          f"{args.workers} worker(s), {args.rounds} alternating rounds each")  # fmt: skip
    print_table(["condition", "median tok/s", "range", "vs neither"], rows)
    print(f"watched / neither, round by round: median {statistics.median(pairs):.3f} "
          f"(range {min(pairs):.3f}-{max(pairs):.3f})")  # fmt: skip
    print("\nCPU seconds per second of each part, mean over the rounds")
    print_table(
        ["part", "neither", "watched", "watched - neither"],
        [[part, f"{n / args.rounds:.4f}", f"{cpu['watched'][part] / args.rounds:.4f}",
          f"{(cpu['watched'][part] - n) / args.rounds:+.4f}"]
         for part, n in cpu["neither"].items()],
    )  # fmt: skip


if __name__ == "__main__":
    main()
