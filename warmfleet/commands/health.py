"""`warmfleet health`: is one part up? For container healthchecks (exit 0 healthy, 1 not).

The gateway and the kvstore answer the standard gRPC health service. A worker serves no
gRPC, so its health is its heartbeat key in Redis: the worker's own liveness thread renews
it (TTL = its lease) only while its loop makes progress, and it is what the gateway routes
by. Its metrics endpoint would only say that an HTTP thread answers, and is off by default.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from broker.keys import draining_key, heartbeat_key
from warmfleet.commands.common import add_redis_url
from warmfleet.probes import HealthProbe

DEFAULT_TIMEOUT_S = 3.0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "health",
        help="exit 0 if a part is healthy, 1 (with the reason on stderr) if not: for "
        "container healthchecks",
        description="Ask one part whether it is healthy, within a deadline. Exit 0: healthy "
        "(one line on stdout); 1: not, or no answer in time (one line on stderr); 2: bad "
        "arguments.",
    )
    hsub = p.add_subparsers(
        dest="health_command", metavar="{grpc,worker}", required=True, parser_class=type(p)
    )
    grpc_p = hsub.add_parser(
        "grpc",
        help="the standard gRPC health service of the gateway or the kvstore",
        description="Healthy when the server at HOST:PORT answers SERVING for --service. The "
        "gateway is SERVING only while at least one worker takes requests; the kvstore "
        "while it runs.",
    )
    grpc_p.add_argument("target", type=target_arg, metavar="HOST:PORT")
    grpc_p.add_argument(
        "--service",
        default="",
        metavar="NAME",
        help="the service asked about: '' (default) is the server as a whole; e.g. "
        "warmfleet.v1.Inference or warmfleet.v1.KVStore",
    )
    _add_timeout(grpc_p)
    grpc_p.set_defaults(run=run_grpc)
    worker_p = hsub.add_parser(
        "worker",
        help="a worker's heartbeat in Redis",
        description="Healthy while the worker's heartbeat key exists in Redis: the worker "
        "renews it (TTL = its lease) while its loop makes progress. A draining worker is "
        "still healthy (it finishes its requests; nothing new is routed to it).",
    )
    worker_p.add_argument("--worker-id", required=True, metavar="ID", help="the worker's id")
    add_redis_url(worker_p)
    _add_timeout(worker_p)
    worker_p.set_defaults(run=run_worker)


def _add_timeout(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout",
        type=timeout_arg,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"give up and report unhealthy after S seconds ({DEFAULT_TIMEOUT_S:g})",
    )


def target_arg(text: str) -> str:
    """argparse type: HOST:PORT with a port in 1..65535 (HOST may be [IPv6])."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with a port in 1..65535: {text!r}")
    return text


def timeout_arg(text: str) -> float:
    """argparse type: seconds, above 0."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be above 0: {text!r}")
    return seconds


def run_grpc(args: argparse.Namespace) -> int:
    what = f"{args.target} (service {args.service!r})"
    probe = HealthProbe(args.target, timeout_s=args.timeout, service=args.service)
    try:
        reason = probe.not_serving_reason()
    finally:
        probe.close()
    if reason is not None:
        return _unhealthy(f"{what}: {reason}")
    print(f"{what}: SERVING")
    return 0


def run_worker(args: argparse.Namespace) -> int:
    client = redis.Redis.from_url(
        args.redis_url,
        decode_responses=True,
        socket_connect_timeout=args.timeout,
        socket_timeout=args.timeout,
        retry=Retry(NoBackoff(), 0),  # one try: the deadline is the timeout, not a multiple
    )
    try:
        pipe = client.pipeline(transaction=False)
        pipe.get(heartbeat_key(args.worker_id))
        pipe.pttl(heartbeat_key(args.worker_id))
        pipe.exists(draining_key(args.worker_id))
        beat, ttl_ms, draining = pipe.execute()
    except redis.RedisError as e:
        return _unhealthy(f"worker {args.worker_id}: cannot read Redis at {args.redis_url}: {e}")
    finally:
        client.close()
    if beat is None:
        return _unhealthy(f"worker {args.worker_id}: no heartbeat in Redis (not started, or dead)")
    status = _status(beat)
    state = "draining" if draining or status.get("stopping") else "taking requests"
    running = status.get("num_running", "?")
    print(f"worker {args.worker_id}: heartbeat fresh ({ttl_ms} ms left), {state}, "
          f"{running} running")  # fmt: skip
    return 0


def _status(beat: str) -> dict[str, Any]:
    """The worker's status as its heartbeat holds it ({} if unreadable: still alive)."""
    try:
        status = json.loads(beat)
    except ValueError:
        return {}
    return status if isinstance(status, dict) else {}


def _unhealthy(reason: str) -> int:
    print(f"warmfleet health: {reason}", file=sys.stderr)
    return 1
