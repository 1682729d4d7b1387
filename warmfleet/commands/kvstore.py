"""`warmfleet kvstore`: the owner of the residency index, eviction orders and the disk budget."""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import redis

from common.errors import ServiceError
from common.grpc_guard import SyncRequestGuard
from common.grpc_serve import serve
from common.v1 import kvstore_pb2_grpc
from kvstore.grpc_service import SERVICE_NAME, KVStoreService, size_checks
from kvstore.metrics import KVStoreMetrics
from kvstore.service import KVStore
from warmfleet.commands.common import add_metrics, add_redis_url, add_spill_dir, serve_metrics
from warmfleet.parent_watch import watch_parent
from warmfleet.redis_conn import connect
from warmfleet.sizes import format_size, size_arg

DEFAULT_PORT = 50052


def register(sub: Any) -> None:
    p = sub.add_parser(
        "kvstore",
        help="run the kvstore: tracks where every session's KV lives, orders workers to "
        "spill idle sessions over their warm budget, keeps the spill directory within "
        "its disk budget; serves warmfleet.v1.KVStore for operators",
    )
    add_redis_url(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"gRPC port ({DEFAULT_PORT})")
    add_spill_dir(p, allow_none=False)
    p.add_argument(
        "--disk-budget",
        type=size_arg,
        default=None,
        metavar="SIZE",
        help="spill files kept at most (e.g. 20G); beyond it the least recently used are "
        "deleted and their sessions recomputed when they return (default: half the free "
        "space of the spill directory's file system at start)",
    )
    add_metrics(p)
    p.set_defaults(run=run)


def default_disk_budget(spill_dir: Path) -> int:
    spill_dir.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(spill_dir).free // 2


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s kvstore: %(message)s"
    )
    spill_dir = Path(args.spill_dir)
    try:
        budget = args.disk_budget
        if budget is None:
            budget = default_disk_budget(spill_dir)
    except OSError as e:
        raise ServiceError(f"cannot use the spill directory {spill_dir}: {e}") from e
    r = connect(args.redis_url, block_ms=1000, max_connections=64)
    store = KVStore(r, spill_dir, budget)
    try:
        store.start()
    except redis.RedisError as e:
        raise ServiceError(f"cannot reach Redis at {args.redis_url}: {e}") from e
    try:
        add = kvstore_pb2_grpc.add_KVStoreServicer_to_server
        service = [(add, KVStoreService(store), SERVICE_NAME)]
        guard = SyncRequestGuard(size_checks())
        server, port, _ = serve(service, f"{args.host}:{args.port}", 16, guard=guard)
    except (OSError, RuntimeError) as e:
        raise ServiceError(f"cannot listen on {args.host}:{args.port}: {e}") from e
    serve_metrics(args, KVStoreMetrics(store).serve)
    logging.info(
        "listening on %s:%d (redis %s; disk budget %s)",
        args.host,
        port,
        args.redis_url,
        format_size(budget),
    )

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        store.stopping.set()

    watch_parent(lambda: store.stopping.set())
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    store.run()  # until a signal
    server.stop(1.0)
    logging.info("stopped")
    return 0
