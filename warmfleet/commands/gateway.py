"""`warmfleet gateway`: the front door (gRPC and HTTP on one event loop); validates, routes
and streams tokens back."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from common.errors import ServiceError
from engine.text.gguf_file import open_gguf, read_metadata
from engine.text.model_config import ModelConfig
from engine.text.tokenizer import Tokenizer
from gateway.auth import LOCAL, KeyRing
from gateway.core import GatewayConfig
from gateway.memory import tune_malloc
from gateway.reasoning import ReasoningParser, parses_thoughts
from gateway.server import SPARE_CONNECTIONS, Gateway, Listen
from gateway.work_gate import MAX_RUNNING
from warmfleet.commands.common import add_redis_url
from warmfleet.models import resolve_model
from warmfleet.parent_watch import watch_parent
from warmfleet.redis_conn import connect_async
from warmfleet.sizes import size_arg

DEFAULT_PORT = 50051
OTHER_THREADS = 2  # asyncio.to_thread's (heap trims); tokenizing has its own (WorkGate)
TOKENIZER_THREADS = MAX_RUNNING + OTHER_THREADS  # the threads both pools may start
DEFAULT_HTTP_PORT = 8000

DRAIN_S = 10.0
REDIS_CONNECTIONS = 64  # shared by every open call; one of them is the results reader's
REDIS_WAIT_S = 5.0  # a call finding them all busy waits this long, then gets UNAVAILABLE
SPARE_FILES = 256  # files the gateway needs besides its clients' sockets


def register(sub: Any) -> None:
    p = sub.add_parser(
        "gateway", help="run the gateway (gRPC, and the OpenAI and Anthropic HTTP APIs)"
    )
    add_redis_url(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"gRPC port ({DEFAULT_PORT})")
    p.add_argument(
        "--http-port",
        type=int,
        default=DEFAULT_HTTP_PORT,
        help=f"HTTP port: OpenAI and Anthropic APIs, sessions ({DEFAULT_HTTP_PORT})",
    )
    p.add_argument(
        "--model",
        metavar="PATH",
        help="GGUF file whose tokenizer and chat "
        "template the gateway uses (default: the default model)",
    )
    p.add_argument(
        "--model-name",
        action="append",
        metavar="NAME",
        help="the model id the HTTP APIs report and accept (repeatable: the first is reported, "
        "any is accepted; default: the model file's name without .gguf)",
    )
    p.add_argument(
        "--reasoning-parser",
        choices=[p.value for p in ReasoningParser],
        default=ReasoningParser.AUTO.value,
        help="which part of a reply is reasoning: think, a <think>...</think> span at its "
        "start; auto (default): think when the chat template mentions <think>, else none",
    )
    p.add_argument(
        "--keys",
        metavar="FILE",
        help="API keys (TOML, hashed; see `warmfleet keys add`): each caller must send "
        "'authorization: Bearer KEY' (or 'x-api-key: KEY') and gets its key's tenant; "
        "without it every caller is the single local tenant",
    )
    _add_limits(p)
    add_local_limits(p)
    p.set_defaults(run=run)


def _add_limits(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-body-bytes",
        type=size_arg,
        default=4 << 20,
        metavar="SIZE",
        help="largest HTTP request body; larger ones get 413 (4M)",
    )
    p.add_argument(
        "--max-message-bytes",
        type=size_arg,
        default=16 << 20,
        metavar="SIZE",
        help="largest gRPC request message; larger ones are refused by gRPC itself with "
        "RESOURCE_EXHAUSTED (16M; a Generate request too large to hold a prompt that fits "
        "the context is refused before that, unread, at once)",
    )
    p.add_argument(
        "--max-streams",
        type=int,
        default=4096,
        metavar="N",
        help="open calls at most on each face (gRPC calls, HTTP requests; one more gets "
        "RESOURCE_EXHAUSTED or 429 with a retry hint); an open stream costs a task and a "
        "queue, not a thread (4096)",
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
        "fails at once with RESOURCE_EXHAUSTED (HTTP 429) and a retry hint (1024)",
    )
    p.add_argument(
        "--worker-wait-s",
        type=float,
        default=30.0,
        metavar="S",
        help="a request that finds no live worker waits this long for one (at most until "
        "its deadline), then fails with UNAVAILABLE (30)",
    )


def add_local_limits(p: argparse.ArgumentParser, passed_on: bool = False) -> None:
    """The keyless local tenant's limits (`gateway`; `up` passes on those given)."""
    p.add_argument(
        "--local-max-concurrent",
        type=positive_int,
        default=None if passed_on else LOCAL.max_concurrent,
        metavar="N",
        help="without --keys: the local tenant's requests running at once; more wait in its "
        f"queue ({LOCAL.max_concurrent})",
    )
    p.add_argument(
        "--local-max-queued",
        type=positive_int,
        default=None if passed_on else LOCAL.max_queued,
        metavar="N",
        help="without --keys: the local tenant's requests waiting; beyond it a request fails "
        f"at once with RESOURCE_EXHAUSTED (HTTP 429) and a retry hint ({LOCAL.max_queued})",
    )


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    tune_malloc()  # before any thread starts: see gateway/memory.py
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s gateway: %(message)s"
    )
    config = GatewayConfig(
        default_timeout_s=args.default_timeout_s,
        max_queued=args.max_queued,
        worker_wait_s=args.worker_wait_s,
    )
    if args.keys:
        keys = KeyRing.load(args.keys)
        logging.info("API keys from %s: tenants %s", args.keys, ", ".join(keys.tenants))
    else:
        keys = KeyRing.open(args.local_max_concurrent, args.local_max_queued)
        logging.info("no key file (--keys): every caller is the single local tenant (at most "
                     "%d running, %d queued)", args.local_max_concurrent,
                     args.local_max_queued)  # fmt: skip
    path = resolve_model(args.model)
    meta = read_metadata(open_gguf(path))
    model_config, tokenizer = ModelConfig.from_metadata(meta), Tokenizer.from_metadata(meta)
    names = tuple(args.model_name or [path.name.removesuffix(".gguf")])
    thoughts = parses_thoughts(ReasoningParser(args.reasoning_parser), tokenizer.chat_template)
    logging.info("reasoning: %s", "think spans are read" if thoughts else "none read")
    listen = Listen(args.host, args.port, args.http_port, args.max_body_bytes, args.max_streams,
                    args.max_message_bytes)  # fmt: skip
    raise_open_files_limit(2 * args.max_streams + SPARE_CONNECTIONS + REDIS_CONNECTIONS
                           + SPARE_FILES)  # fmt: skip
    return asyncio.run(
        _serve(args.redis_url, (tokenizer, model_config, thoughts), config, keys, names, listen)
    )


async def _serve(
    redis_url: str,
    model: tuple[Tokenizer, ModelConfig, bool],
    config: GatewayConfig,
    keys: KeyRing,
    names: tuple[str, ...],
    listen: Listen,
) -> int:
    # a fixed pool: threads do not grow with the streams
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=OTHER_THREADS, thread_name_prefix="blocking")
    )
    r = connect_async(redis_url, block_ms=1000, pool_size=REDIS_CONNECTIONS, wait_s=REDIS_WAIT_S)
    gateway = Gateway(r, *model, config, keys, names)
    try:
        grpc_port, http_port = await gateway.start(listen)
    except OSError as e:
        raise ServiceError(f"cannot listen on {listen.host}: {e}") from e
    logging.info("listening: gRPC %s:%d, HTTP %s:%d (model %s; redis %s)", listen.host,
                 grpc_port, listen.host, http_port, names[0], redis_url)  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, _on_signal, gateway, stop)

    def launcher_gone() -> None:  # on the parent-watch thread
        loop.call_soon_threadsafe(_on_signal, gateway, stop)

    watch_parent(launcher_gone)
    await stop.wait()
    logging.info("stopping: draining streams for up to %.0f s", DRAIN_S)
    await gateway.stop(DRAIN_S)
    await r.aclose()
    logging.info("stopped")
    return 0


def _on_signal(gateway: Gateway, stop: asyncio.Event) -> None:
    """The first signal drains; a second one stops now."""
    if stop.is_set():
        logging.info("second signal: stopping now")
        os._exit(0)
    stop.set()


def raise_open_files_limit(wanted: int) -> None:
    """Every open call holds a socket: allow as many files as the hard limit does, and say
    so when that is fewer than both faces' --max-streams need (a connection beyond the
    limit is not accepted until another closes)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    if soft == unlimited or soft >= wanted:
        return
    raised = wanted if hard == unlimited else min(hard, wanted)
    if raised > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    if raised < wanted:
        logging.warning("open files limited to %d (ulimit -n hard limit): fewer open calls "
                        "than --max-streams fit; raise the limit", raised)  # fmt: skip
