"""The soak's tables: requests by outcome per face, latency by face and priority, memory
per part."""

from __future__ import annotations

import argparse
import statistics
from collections import Counter

from bench.chaos_stream import CANCELLED_BY_CLIENT, HUNG, OK, Attempt
from bench.soak_clients import DISCONNECTED, Soak
from bench.soak_rss import RSS_HEADER, RssLog
from bench.table import print_table

OUTCOME_HEADER = ["face", "requests", "ok", "cancelled / disconnected by the client",
                  "failed (by code)", "hung", "dup/missing tokens", "wrong tokens"]  # fmt: skip
LATENCY_HEADER = ["face", "priority", "ok", "latency p50 (s)", "latency p99 (s)",
                  "TTFT p50 (s)", "TTFT p99 (s)"]  # fmt: skip
INTERRUPTED = (CANCELLED_BY_CLIENT, DISCONNECTED)


def outcome_row(face: str, attempts: list[Attempt]) -> list[str]:
    failed = Counter(a.code for a in attempts if a.code not in (OK, HUNG, *INTERRUPTED))
    return [
        face,
        str(len(attempts)),
        str(sum(a.code == OK for a in attempts)),
        str(sum(a.code in INTERRUPTED for a in attempts)),
        ", ".join(f"{code} {n}" for code, n in sorted(failed.items())) or "0",
        str(sum(a.code == HUNG for a in attempts)),
        f"{sum(a.duplicates for a in attempts)}/{sum(a.missing for a in attempts)}",
        str(sum(a.wrong for a in attempts)),
    ]


def quantiles(values: list[float]) -> tuple[str, str]:
    """p50 and p99, formatted; dashes with fewer than two values."""
    if len(values) < 2:
        return "-", "-"
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return f"{cuts[49]:.2f}", f"{cuts[98]:.2f}"


def latency_row(face: str, priority: str, attempts: list[Attempt]) -> list[str]:
    ok = [a for a in attempts if a.code == OK]
    ttft = [a.arrivals[0][0] - a.start for a in ok if a.arrivals]
    return [face, priority, str(len(ok)), *quantiles([a.latency_s for a in ok]),
            *quantiles(ttft)]  # fmt: skip


def print_report(
    args: argparse.Namespace, soak: Soak, rss: RssLog, leftovers: str, restarts: list[str]
) -> None:
    faces = ["grpc", "http"]
    print(f"soak: {args.clients} clients for {args.minutes:g} min, {args.workers} workers, "
          f"{args.interrupt:.0%} interrupted, deadline {args.deadline_s:.0f} s")  # fmt: skip
    by_face = {f: [a for face, _, a in soak.done if face == f] for f in faces}
    print_table(OUTCOME_HEADER, [outcome_row(f, by_face[f]) for f in faces]
                + [outcome_row("all", [a for _, _, a in soak.done])])  # fmt: skip
    print()
    rows = [latency_row(f, prio, [a for face, p, a in soak.done if face == f and p == prio])
            for f in faces for prio in ("interactive", "batch")]  # fmt: skip
    print_table(LATENCY_HEADER, rows)
    print()
    print_table(RSS_HEADER, rss.rows())
    print(f"after the load, Redis counts: {leftovers}")
    print(f"supervisor: {len(restarts)} report(s)" + "".join(f"\n- {m}" for m in restarts))
