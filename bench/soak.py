"""Many clients for a long time on the system as `warmfleet up` runs it (its children
started again by warmfleet/supervisor.py, should one exit):

    .venv/bin/python -m bench.soak [--clients 64] [--minutes 10]

Half the clients speak gRPC, half HTTP (the OpenAI API, streamed); they belong to three
tenants of a key file (weights 2, 1, 1) and send request after request with a short pause:
INTERACTIVE or BATCH, greedy or seeded sampling, 8 or 24 tokens, in a few sessions of
their own and now and then a new one; some are cancelled (gRPC) or their connection closed
(HTTP) after a few chunks. Every reply is checked against the in-process engine's run of
the same request (token ids and text on gRPC, text and token count on HTTP); every gRPC
stream's chunk indexes for duplicates and gaps. The resident memory of every part (gateway,
kvstore, workers, redis) is sampled every few seconds. Prints: requests by outcome,
latency and time to first token p50/p99 by face and priority, hung requests (none
allowed), duplicate or missing and wrong tokens (none allowed), RSS at the start (once
ready), its peak and at the end (after the load and a settle), and what Redis still
counts as running or queued once every request has ended (0 expected)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import grpc
import httpx
import redis

from bench.chaos_cluster import Fleet, FleetOptions, log
from bench.chaos_stream import CHANNEL_OPTIONS, Expected, reference_model, stub_for
from bench.soak_clients import Soak, all_references, client
from bench.soak_report import print_report
from bench.soak_rss import RssLog
from broker import keys as redis_keys
from gateway.auth import hash_key
from warmfleet.models import resolve_model
from warmfleet.sizes import size_arg

TENANTS = {"acme": 2, "globex": 1, "initech": 1}  # name: weight
_MIB = 1 << 20


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, default=64, help="concurrent clients (64)")
    p.add_argument("--minutes", type=float, default=10.0, help="how long the load runs (10)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    p.add_argument("--interrupt", type=float, default=0.1,
                   help="share of requests cancelled or disconnected mid-stream (0.1)")  # fmt: skip
    p.add_argument("--deadline-s", type=float, default=120.0,
                   help="each request's deadline: one past it is hung (120)")  # fmt: skip
    p.add_argument("--sample-s", type=float, default=5.0, help="RSS sampling period (5)")
    p.add_argument("--settle-s", type=float, default=10.0,
                   help="wait after the load before the last RSS sample (10)")  # fmt: skip
    p.add_argument("--warm-budget", type=size_arg, default=256 * _MIB,
                   help="each worker's warm KV, so that the pools stop growing (256M)")  # fmt: skip
    return p.parse_args(argv)


def write_keys(path: Path) -> list[str]:
    """A key file with one key per tenant, each allowed INTERACTIVE; the keys."""
    keys = [f"soak-{name}-key" for name in TENANTS]
    path.write_text("".join(
        f'[[keys]]\nsha256 = "{hash_key(key)}"\ntenant = "{name}"\nweight = {weight}\n'
        f'max_priority = "interactive"\n\n'
        for key, (name, weight) in zip(keys, TENANTS.items(), strict=True)
    ), encoding="utf-8")  # fmt: skip
    return keys


async def run_clients(soak: Soak, args: argparse.Namespace, sup: asyncio.Task[None]) -> None:
    """The clients for `args.minutes`, or until the supervision fails."""
    faces = ["grpc", "http"]
    tasks = [asyncio.create_task(client(soak, i, faces[i % 2])) for i in range(args.clients)]
    end = time.monotonic() + args.minutes * 60
    while time.monotonic() < end and not sup.done():
        await asyncio.wait({sup}, timeout=min(30.0, max(0.0, end - time.monotonic())))
        log(f"{len(soak.done)} requests ended")
    soak.stop.set()
    log("load stopping: waiting for the requests in flight")
    await asyncio.wait(tasks, timeout=args.deadline_s + 10)


async def soak_run(
    fleet: Fleet, args: argparse.Namespace, soak_keys: list[str], expected: dict[str, Expected]
) -> tuple[Soak, RssLog]:
    assert fleet.cluster is not None
    stop_supervising, stop_sampling = asyncio.Event(), asyncio.Event()
    sup = asyncio.create_task(fleet.supervise(stop_supervising))
    rss = RssLog()
    sampler = asyncio.create_task(rss.run(fleet.processes, args.sample_s, stop_sampling))
    limits = httpx.Limits(max_connections=2 * args.clients, max_keepalive_connections=0)
    async with (
        grpc.aio.insecure_channel(fleet.cluster.target, options=CHANNEL_OPTIONS) as channel,
        httpx.AsyncClient(
            base_url=fleet.cluster.http_url, limits=limits, timeout=args.deadline_s + 10
        ) as http,  # fmt: skip
    ):
        soak = Soak(stub_for(channel), http, soak_keys, expected, f"soak{int(time.time())}",
                    args.deadline_s, args.interrupt)  # fmt: skip
        try:
            await run_clients(soak, args, sup)
            await asyncio.sleep(args.settle_s)
        finally:
            stop_sampling.set()
            await sampler
            rss.sample(fleet.processes())  # the end
            stop_supervising.set()
            await sup
    return soak, rss


def leftovers(redis_url: str) -> str:
    """What Redis still counts as running (per tenant) and queued after the load."""
    r = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=5.0)
    try:
        running = r.hgetall(redis_keys.RUNNING)
        queued = r.get(redis_keys.QUEUED)
    finally:
        r.close()
    return f"running {running or {}}, queued {queued or 0}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    path = resolve_model(None)
    log("computing the reference replies in-process")
    expected = all_references(reference_model(path))
    keys_file = Path(tempfile.mkdtemp(prefix="warmfleet-soak-")) / "keys.toml"
    soak_keys = write_keys(keys_file)
    fleet = Fleet(FleetOptions(model=path, workers=args.workers, warm_budget=args.warm_budget,
                               keys_file=keys_file))  # fmt: skip
    try:
        fleet.start()
        soak, rss = asyncio.run(soak_run(fleet, args, soak_keys, expected))
        assert fleet.cluster is not None
        left = leftovers(fleet.cluster.redis_url)
        restarts = [m.splitlines()[0] for _, m in fleet.events]
    finally:
        fleet.stop()
    print_report(args, soak, rss, left, restarts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
