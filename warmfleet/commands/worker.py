"""`warmfleet worker`: one process per device; loads the model once and serves from Redis."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from types import FrameType
from typing import Any

from broker.worker_broker import WorkerBroker
from engine.config import EngineConfig
from engine.device import set_threads
from engine.engine import Engine
from engine.model import Model
from warmfleet.commands.common import add_compute, add_redis_url
from warmfleet.models import resolve_model
from warmfleet.redis_conn import connect
from worker.loop import Worker, WorkerConfig


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
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s worker {args.worker_id}: %(message)s",
    )
    config = WorkerConfig(worker_id=args.worker_id, lease_s=args.lease_s)
    engine_config = EngineConfig(max_running=args.max_running)
    threads = set_threads(args.threads)
    path = resolve_model(args.model)
    logging.info("loading %s (%d threads)", path.name, threads)
    model = Model.load(path, device=args.device, dtype=args.dtype)
    r = connect(args.redis_url, block_ms=config.idle_block_ms)
    worker = Worker(
        Engine(model, engine_config), WorkerBroker(r, config.worker_id, config.lease_s), config
    )

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if worker.stopping:
            logging.info("second signal: stopping now")
            worker.stop_now = True
        else:
            logging.info("draining: finishing %d running requests", len(worker.inflight))
            worker.stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    worker.run()
    logging.info("stopped")
    return 0
