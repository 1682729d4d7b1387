"""`warmfleet up`: start Redis, the workers and the gateway on this machine; Ctrl-C stops them."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import grpc

from common.errors import InvalidRequestError
from warmfleet.client import KVStoreClient
from warmfleet.cluster_config import ClusterConfig
from warmfleet.commands.common import add_device, add_kv_dtype, add_spill_dir, add_weights
from warmfleet.commands.gateway import DEFAULT_HTTP_PORT, DEFAULT_PORT, add_local_limits
from warmfleet.commands.kvstore import DEFAULT_PORT as DEFAULT_KVSTORE_PORT
from warmfleet.demo import run_demo
from warmfleet.launcher import Cluster
from warmfleet.sizes import format_size, size_arg
from warmfleet.stop_signals import StopNow, StopRequested, StopSignals
from warmfleet.supervisor import Supervisor

STOP_TIMEOUT_S = 15.0
# Without Redis no part can hand its work over, so none is left to drain: each gets a stop
# signal, a second one (stop now) a second later, and SIGKILL at this.
NO_DRAIN_TIMEOUT_S = 4.0
NO_DRAIN = "stopping every part now without draining (nothing can be handed over without Redis)"
_POLL_S = 0.1  # how soon an exit is seen: a dead worker's requests are adopted then


def register(sub: Any) -> None:
    p = sub.add_parser(
        "up",
        help="start warmfleet on this machine: a private redis-server (unless --redis-url), "
        "the kvstore, the workers and the gRPC gateway; Ctrl-C stops them all",
    )
    p.add_argument("--workers", type=int, default=2, metavar="N", help="worker processes (2)")
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, metavar="P", help=f"gRPC port ({DEFAULT_PORT})"
    )
    p.add_argument(
        "--http-port",
        type=int,
        default=DEFAULT_HTTP_PORT,
        metavar="P",
        help=f"HTTP port: the OpenAI and Anthropic APIs ({DEFAULT_HTTP_PORT})",
    )
    p.add_argument(
        "--kvstore-port",
        type=int,
        default=DEFAULT_KVSTORE_PORT,
        metavar="P",
        help=f"the kvstore's gRPC port, for operators ({DEFAULT_KVSTORE_PORT})",
    )
    p.add_argument(
        "--redis-url", metavar="URL", help="use this Redis instead of a private redis-server"
    )
    p.add_argument(
        "--model",
        metavar="PATH",
        help="a GGUF file of a llama, qwen2, qwen3, qwen3moe or gpt-oss model (default: the "
        "default model, fetched first)",
    )
    p.add_argument(
        "--threads", type=int, metavar="N", help="BLAS threads per worker (default: cores / N)"
    )
    add_device(p, passed_on=True)
    add_weights(p, passed_on=True)
    add_kv_dtype(p, passed_on=True)
    _add_part_options(p)
    p.add_argument(
        "--demo",
        action="store_true",
        help="once up, run two sessions at once (two turns each) and print their replies",
    )
    p.set_defaults(run=run)


def _add_part_options(p: argparse.ArgumentParser) -> None:
    """Options `up` passes on to the workers, the kvstore and the gateway."""
    add_spill_dir(p, allow_none=False)
    p.add_argument(
        "--warm-budget",
        type=size_arg,
        metavar="SIZE",
        help="idle sessions' KV kept in each worker's memory (see `warmfleet worker`)",
    )
    p.add_argument(
        "--disk-budget",
        type=size_arg,
        metavar="SIZE",
        help="spill files kept at most (see `warmfleet kvstore`)",
    )
    p.add_argument(
        "--keys",
        metavar="FILE",
        help="API keys for the gateway (see `warmfleet gateway --keys`); without it one "
        "local tenant",
    )
    add_local_limits(p, passed_on=True)


def run(args: argparse.Namespace) -> int:
    if args.demo and args.keys:
        raise InvalidRequestError("--demo", "talks without an API key; leave out --keys")
    config = ClusterConfig(
        num_workers=args.workers,
        port=args.port,
        http_port=args.http_port,
        redis_url=args.redis_url,
        model=args.model,
        threads_per_worker=args.threads,
        device=args.device,
        weights=args.weights,
        kv_dtype=args.kv_dtype,
        spill_dir=args.spill_dir,
        warm_budget=args.warm_budget,
        disk_budget=args.disk_budget,
        kvstore_port=args.kvstore_port,
        keys_file=args.keys,
        local_max_concurrent=args.local_max_concurrent,
        local_max_queued=args.local_max_queued,
    )
    cluster = Cluster(config)  # the model is fetched once, before any worker starts
    signals = StopSignals().install()
    try:
        with signals.interruptible():
            cluster.start(should_stop=lambda: signals.requested)
        print(_banner(cluster), flush=True)
        if args.demo:
            if run_demo(cluster.target, lambda: signals.requested):
                print(kv_summary(cluster.kvstore_target), flush=True)
            else:
                print("warmfleet: the demo failed (see above); still up", file=sys.stderr)
        return _supervise(cluster, signals)
    except (StopRequested, StopNow):
        return 130
    finally:
        _stop(cluster, signals)
        signals.restore()


def kv_summary(kvstore_target: str) -> str:
    """One line from the kvstore: sessions per tier and each worker's warm pool."""
    try:
        with KVStoreClient(kvstore_target, timeout_s=5.0) as kv:
            u = kv.usage()
    except grpc.RpcError as e:
        return f"[kvstore] usage unavailable: {e.code().name}"
    tiers = ", ".join(f"{getattr(u.tiers, t)} {t}" for t in ("hot", "warm", "disk", "gone"))
    pools = ", ".join(
        f"{w.worker_id} {format_size(w.pool_bytes)} of {format_size(w.warm_budget_bytes)}"
        for w in u.workers
    )
    return f"[kvstore] sessions: {tiers} · warm pools: {pools} · spills {u.counters.spills}"


def _banner(cluster: Cluster) -> str:
    target = "" if cluster.target == f"127.0.0.1:{DEFAULT_PORT}" else f" --target {cluster.target}"
    parts = ["gateway", "kvstore", *cluster.worker_ids]
    metrics = ", ".join(f"{name} {cluster.metrics_url(name)}" for name in parts)
    return (
        f"warmfleet is up: gRPC {cluster.target} · HTTP {cluster.http_url} · workers "
        f"{', '.join(cluster.worker_ids)} · kvstore {cluster.kvstore_target} · redis "
        f"{cluster.redis_url} · logs {cluster.log_dir}\n"
        f"dashboard: {cluster.http_url}/dashboard · in a terminal: warmfleet top --redis-url "
        f"{cluster.redis_url} · metrics: "
        f"{metrics}\n"
        f"try: warmfleet chat --session demo{target}    (Ctrl-C stops everything)\n"
        f"  or: curl {cluster.http_url}/v1/chat/completions -H 'X-Session-Id: demo' "
        """-d '{"messages": [{"role": "user", "content": "Hi!"}]}'"""
    )


def _supervise(cluster: Cluster, signals: StopSignals) -> int:
    """Until a stop signal (0), start again each child that exits (warmfleet/supervisor.py);
    if the private Redis exits, stop every child at once and return 1."""
    supervisor = Supervisor(cluster, cluster.config.progress)
    while not signals.requested:
        if (reason := supervisor.poll()) is not None:
            print(f"warmfleet: cannot serve any more, {NO_DRAIN}: {reason}", file=sys.stderr)
            cluster.stop(timeout_s=NO_DRAIN_TIMEOUT_S, drain=False)
            return 1
        time.sleep(_POLL_S)
    return 0


def _stop(cluster: Cluster, signals: StopSignals) -> None:
    """Stop every child: draining first, at once after a second signal."""
    if signals.requested:
        print("warmfleet: stopping... (Ctrl-C again to stop now)", file=sys.stderr, flush=True)
    try:
        cluster.stop(timeout_s=0 if signals.urgent else STOP_TIMEOUT_S)
    except StopNow:
        print("warmfleet: stopping now", file=sys.stderr, flush=True)
        cluster.stop(timeout_s=0)
