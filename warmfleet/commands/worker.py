"""`warmfleet worker`: one process per device; loads the model once and serves from Redis."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from broker.worker_broker import WorkerBroker
from engine.config import EngineConfig
from engine.device import set_threads
from engine.engine import Engine
from engine.model import Model
from warmfleet.commands.common import add_compute, add_redis_url
from warmfleet.models import resolve_model
from warmfleet.parent_watch import watch_parent
from warmfleet.redis_conn import connect
from worker.loop import Worker, WorkerConfig
from worker.spill import SpillStore
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
        "over by another worker",
    )
    p.add_argument(
        "--warm-budget-mb",
        type=int,
        default=None,
        metavar="MB",
        help="KV of idle sessions kept in memory; beyond it the least recently used "
        "go to disk (default: a quarter of the memory available at start, at most "
        "8192)",
    )
    p.add_argument(
        "--spill-dir",
        default=default_spill_dir(),
        metavar="DIR",
        help="where evicted sessions are written, shared by the workers of a host "
        "(default: $WARMFLEET_SPILL_DIR, else ~/.cache/warmfleet/spill); "
        "'none' forgets evicted sessions instead",
    )
    p.set_defaults(run=run)


def default_spill_dir() -> str:
    return os.environ.get(
        "WARMFLEET_SPILL_DIR", str(Path.home() / ".cache" / "warmfleet" / "spill")
    )


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
    config = WorkerConfig(worker_id=args.worker_id, lease_s=args.lease_s)
    budget = (
        args.warm_budget_mb << 20
        if args.warm_budget_mb is not None
        else default_warm_budget_bytes()
    )
    engine_config = EngineConfig(max_running=args.max_running, session_budget_bytes=budget)
    threads = set_threads(args.threads)
    path = resolve_model(args.model)
    logging.info("loading %s (%d threads)", path.name, threads)
    model = Model.load(path, device=args.device, dtype=args.dtype)
    r = connect(args.redis_url, block_ms=config.idle_block_ms)
    spiller = None
    if args.spill_dir != "none":
        spiller = Spiller(SpillStore(args.spill_dir, model.fingerprint), model)
        logging.info(
            "spilling evicted sessions to %s (warm budget %d MiB)", args.spill_dir, budget >> 20
        )
    broker = WorkerBroker(r, config.worker_id, config.lease_s)
    worker = Worker(Engine(model, engine_config), broker, config, spiller)

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
