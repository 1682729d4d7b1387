"""The gateway's resident memory through bursts of large and hostile HTTP bodies:

    .venv/bin/python -m bench.gateway_bursts [--rounds 5] [--at-once 10] [--kinds all]

One worker and the gateway as `warmfleet up` runs them. Each round sends every kind of body
below, `--at-once` of a kind together, the kinds one after the other; the gateway's RSS is
read 3 s after each round and once it settles. Prints the RSS after each round and each
kind's answers (status codes), so a kind that stops being refused is seen."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.soak_rss import rss_kib
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster
from warmfleet.models import resolve_model

SETTLE_S = 30.0
_MIB = 1024
WORDS = ("the", "sea", "ships", "harbour", "wind", "sail", "rope", "anchor", "tide", "cold")


def chat(content: object, **extra: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 2, **extra}


def nested(depth: int) -> str:
    """A chat whose content is an array `depth` levels deep, as JSON text."""
    return '{"messages": [{"role": "user", "content": ' + "[" * depth + "]" * depth + "}]}"


def prose(num_bytes: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(num_bytes // 5))[:num_bytes]


@dataclass(frozen=True)
class BodyKind:
    """Bodies of one kind: the answer each gets, and a request's body from its index."""

    status: int
    make: Callable[[int], bytes]


def body_kinds() -> dict[str, BodyKind]:
    """Large and hostile bodies, accepted and refused, by name."""

    def doc(value: object) -> bytes:
        return json.dumps(value).encode()

    return {
        # served: a small prompt beside a 3.5 MB array of distinct numbers (an ignored field)
        "3.5 MB array, served": BodyKind(
            200, lambda i: doc(chat("Say hi", extra=[i + k / 7 for k in range(200_000)]))
        ),
        # refused from its size before tokenizing (the byte bound)
        "3.9 MB prompt": BodyKind(400, lambda i: doc(chat("x" * 3_900_000 + str(i)))),
        # tokenized on the gate's threads, then refused: longer than the context
        "600 KB prose": BodyKind(400, lambda i: doc(chat(prose(600_000, i)))),
        # many small objects: more messages than the context holds
        "100k messages": BodyKind(
            400,
            lambda i: doc(
                {"messages": [{"role": "user", "content": f"m{k}"} for k in range(100_000 + i)]}
            ),
        ),
        "nested 1000": BodyKind(400, lambda i: nested(1000 + i).encode()),
        "nested 100k": BodyKind(400, lambda i: nested(100_000 + i).encode()),
        # past --max-body-bytes (4M): refused from its Content-Length, unread
        "5 MB body": BodyKind(413, lambda i: doc(chat("z" * 5_000_000 + str(i)))),
    }


async def burst(url: str, kinds: dict[str, BodyKind], at_once: int) -> Counter[tuple[str, int]]:
    """Every kind, `at_once` of it together; how many got each status, by kind."""
    answers: Counter[tuple[str, int]] = Counter()
    limits = httpx.Limits(max_connections=at_once)
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        for name, kind in kinds.items():
            bodies = [kind.make(i) for i in range(at_once)]
            replies = await asyncio.gather(
                *(http.post("/v1/chat/completions", content=b, headers=headers) for b in bodies)
            )
            del bodies
            answers.update((name, r.status_code) for r in replies)
    return answers


def settle(pid: int, within_s: float) -> int:
    """The gateway's RSS once two readings a second apart agree within 1 MiB (KiB)."""
    deadline = time.monotonic() + within_s
    last = rss_kib(pid) or 0
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = rss_kib(pid) or 0
        if abs(now - last) < _MIB:
            return now
        last = now
    return last


def run(args: argparse.Namespace) -> None:
    kinds = body_kinds()
    if args.kinds != "all":
        kinds = {k: v for k, v in kinds.items() if k in args.kinds.split(",")}
    tmp = Path(tempfile.mkdtemp(prefix="bursts-"))
    config = ClusterConfig(
        num_workers=1,
        model=resolve_model(None),
        log_dir=tmp / "logs",
        spill_dir=tmp / "spill",
        progress=lambda _: None,
    )
    with Cluster(config) as cluster:
        pid = cluster.processes["gateway"].pid
        warm_up = BodyKind(200, lambda i: json.dumps(chat("Hi")).encode())
        asyncio.run(burst(cluster.http_url, {"warm-up": warm_up}, 2))
        start = settle(pid, SETTLE_S)
        print(f"gateway pid {pid}: {start / _MIB:.1f} MiB at the start")
        for n in range(1, args.rounds + 1):
            answers = asyncio.run(burst(cluster.http_url, kinds, args.at_once))
            time.sleep(3.0)
            rss = rss_kib(pid) or 0
            print(f"round {n}: {rss / _MIB:.1f} MiB 3 s later ({(rss - start) / _MIB:+.1f})")
            if n == 1:
                print(
                    "  answers: "
                    + ", ".join(f"{k} {code} x{v}" for (k, code), v in sorted(answers.items()))
                )
        end = settle(pid, SETTLE_S)
        print(f"settled: {end / _MIB:.1f} MiB ({(end - start) / _MIB:+.1f} from the start)")
        print(f"logs: {tmp / 'logs'}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="bursts (5)")
    p.add_argument("--at-once", type=int, default=10, help="bodies of a kind sent together (10)")
    p.add_argument("--kinds", default="all", help="comma-separated kinds to send (all)")
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
