"""`warmfleet worker`: one process per device; loads the model once and serves from Redis."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import time
from types import FrameType
from typing import Any

from broker.worker_broker import WorkerBroker
from common.errors import InvalidRequestError
from engine.config import EngineConfig
from engine.device import set_threads
from engine.engine import Engine
from engine.kv_files.kv_dtypes import kv_name
from engine.kv_files.spill_file import SpillStore
from engine.model import Model
from warmfleet.commands.common import (
    add_compute,
    add_metrics,
    add_redis_url,
    add_spill_dir,
    serve_metrics,
)
from warmfleet.models import resolve_model
from warmfleet.parent_watch import watch_parent
from warmfleet.redis_conn import connect
from warmfleet.sizes import format_size, size_arg
from worker.config import WorkerConfig
from worker.loop import Worker
from worker.spiller import Spiller


def register(sub: Any) -> None:
    p = sub.add_parser("worker", help="run one worker: the model on one device, fed from Redis")
    add_redis_url(p)
    p.add_argument("--worker-id", default=f"{socket.gethostname()}-{os.getpid()}", metavar="ID")
    p.add_argument("--model", metavar="PATH", help="GGUF file (default: the default model)")
    add_compute(p)
    p.add_argument(
        "--max-running", type=int, default=32, metavar="N", help="sequences decoded together"
    )
    p.add_argument(
        "--lease-s",
        type=float,
        default=5.0,
        metavar="S",
        help="a request whose worker stops renewing its lease this long is taken "
        "over by another worker: the backstop of --heartbeat-ttl-s (5)",
    )
    p.add_argument(
        "--heartbeat-ttl-s",
        type=float,
        default=1.5,
        metavar="S",
        help="the heartbeat, written every third of this by a thread of its own, lapses "
        "this long after the worker dies; then a live worker adopts its requests (1.5)",
    )
    p.add_argument(
        "--step-budget-ms",
        type=float,
        default=250.0,
        metavar="MS",
        help="while requests decode, a step prefills only the prompt tokens that fit this "
        "time (learned from the steps run), so a long prompt arriving does not stall "
        "their tokens; 0 turns it off (250)",
    )
    p.add_argument(
        "--warm-budget",
        type=size_arg,
        default=None,
        metavar="SIZE",
        help="KV of idle sessions kept in memory (e.g. 512M, 4G); beyond it the kvstore "
        "has the least recently used written to disk (default: a quarter of the memory "
        "available at start, at most 8G)",
    )
    add_spill_dir(p)
    add_metrics(p)
    p.set_defaults(run=run)


def default_warm_budget_bytes() -> int:
    """A quarter of MemAvailable (Linux), capped at 8 GiB; 2 GiB where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 2 << 30
    return min(available // 4, 8 << 30)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s worker {args.worker_id}: %(message)s",
    )
    budget = args.warm_budget if args.warm_budget is not None else default_warm_budget_bytes()
    config = WorkerConfig(
        worker_id=args.worker_id,
        lease_s=args.lease_s,
        heartbeat_ttl_s=args.heartbeat_ttl_s,
        heartbeat_interval_s=args.heartbeat_ttl_s / 3,
        warm_budget_bytes=budget,
    )
    if args.step_budget_ms < 0:
        raise InvalidRequestError("--step-budget-ms", "must be >= 0")
    engine_config = EngineConfig(
        max_running=args.max_running,
        session_budget_bytes=budget,  # the worker moves it to its ceiling once a kvstore runs
        session_ceiling_bytes=config.pool_ceiling_bytes,
        step_budget_s=args.step_budget_ms / 1000 if args.step_budget_ms else None,
    )
    worker = _build(args, config, engine_config)
    serve_metrics(args, worker.metrics.serve)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if worker.stopping:
            logging.info("second signal: stopping now")
            worker.stop_now = True
        else:
            logging.info("draining: finishing %d running requests", len(worker.inflight))
            worker.stopping = True

    def on_parent_gone() -> None:
        logging.info("the launcher is gone: draining")
        worker.stopping = True

    watch_parent(on_parent_gone)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    worker.run()
    logging.info("stopped")
    return 0


def _build(args: argparse.Namespace, config: WorkerConfig, engine_config: EngineConfig) -> Worker:
    """Load the model, warm its kernels up, connect: a worker ready to register."""
    threads = set_threads(args.threads)
    path = resolve_model(args.model)
    logging.info("loading %s (%d threads)", path.name, threads)
    model = Model.load(
        path, device=args.device, dtype=args.dtype, weights=args.weights, kv_dtype=args.kv_dtype
    )
    logging.info(
        "on %s: weights %s, %s in memory; KV %s",
        model.device,
        model.weights_mode,
        format_size(model.weight_bytes),
        kv_name(model.kv_dtype),
    )
    r = connect(args.redis_url, block_ms=config.idle_block_ms)
    engine = Engine(model, engine_config)
    spiller = None
    if args.spill_dir != "none":
        store = SpillStore(args.spill_dir, model.fingerprint, engine.pool.block_size)
        spiller = Spiller(store, model)
        logging.info("spilling evicted sessions to %s (warm budget %s)", args.spill_dir,
                     format_size(config.warm_budget_bytes))  # fmt: skip
    t0 = time.perf_counter()
    engine.warm_up()
    logging.info("kernels ready in %.1f s", time.perf_counter() - t0)
    return Worker(engine, WorkerBroker(r, config.worker_id, config.lease_s), config, spiller)
