"""`warmfleet gateway`: the gRPC front door; validates, routes and streams tokens back."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType
from typing import Any

from broker.gateway_broker import GatewayBroker
from common.errors import ServiceError
from engine.config import ModelConfig
from engine.gguf_file import open_gguf, read_metadata
from engine.tokenizer import Tokenizer
from gateway.auth import KeyRing
from gateway.core import POLL_MS, GatewayConfig
from gateway.server import build_server
from warmfleet.commands.common import add_redis_url
from warmfleet.models import resolve_model
from warmfleet.parent_watch import watch_parent
from warmfleet.redis_conn import connect

DRAIN_S = 10.0


def register(sub: Any) -> None:
    p = sub.add_parser("gateway", help="run the gRPC gateway")
    add_redis_url(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=50051)
    p.add_argument(
        "--model",
        metavar="PATH",
        help="GGUF file whose tokenizer and chat "
        "template the gateway uses (default: the default model)",
    )
    p.add_argument(
        "--max-streams",
        type=int,
        default=256,
        metavar="N",
        help="concurrent RPCs (one thread each)",
    )
    p.add_argument(
        "--default-timeout-s",
        type=float,
        default=600.0,
        metavar="S",
        help="deadline of a request whose client set none",
    )
    p.add_argument(
        "--max-queued",
        type=int,
        default=1024,
        metavar="N",
        help="requests waiting in the fair queues, all tenants together; beyond it a request "
        "fails at once with RESOURCE_EXHAUSTED and a retry-after-ms hint (1024)",
    )
    p.add_argument(
        "--worker-wait-s",
        type=float,
        default=30.0,
        metavar="S",
        help="a request that finds no live worker waits this long for one (at most until "
        "its deadline), then fails with UNAVAILABLE (30)",
    )
    p.add_argument(
        "--keys",
        metavar="FILE",
        help="API keys (TOML, hashed; see `warmfleet keys add`): each caller must send "
        "'authorization: Bearer KEY' and gets its key's tenant; without it every caller "
        "is the single local tenant",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s gateway: %(message)s"
    )
    config = GatewayConfig(
        default_timeout_s=args.default_timeout_s,
        max_queued=args.max_queued,
        worker_wait_s=args.worker_wait_s,
    )
    keys = KeyRing.load(args.keys) if args.keys else KeyRing.open()
    if keys.enabled:
        logging.info("API keys from %s: tenants %s", args.keys, ", ".join(keys.tenants))
    else:
        logging.info("no key file (--keys): every caller is the single local tenant")
    meta = read_metadata(open_gguf(resolve_model(args.model)))
    model_config, tokenizer = ModelConfig.from_metadata(meta), Tokenizer.from_metadata(meta)
    r = connect(args.redis_url, block_ms=POLL_MS, max_connections=args.max_streams + 8)
    try:
        server, port, watch = build_server(
            GatewayBroker(r),
            tokenizer,
            model_config,
            config,
            f"{args.host}:{args.port}",
            args.max_streams,
            keys,
        )
    except (OSError, RuntimeError) as e:
        raise ServiceError(f"cannot listen on {args.host}:{args.port}: {e}") from e
    logging.info("listening on %s:%d (redis %s)", args.host, port, args.redis_url)
    stopped = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if stopped.is_set():
            server.stop(0)
        else:
            logging.info("stopping: draining streams for up to %.0f s", DRAIN_S)
            stopped.set()
            server.stop(DRAIN_S)

    watch_parent(lambda: on_signal(signal.SIGTERM, None))
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.wait_for_termination()
    watch.stop()
    logging.info("stopped")
    return 0
