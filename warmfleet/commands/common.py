"""Options that several subcommands share, defined once."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from pathlib import Path

from common.enums import DEVICES
from common.errors import InvalidRequestError, ServiceError
from warmfleet.models import env_int
from warmfleet.redis_conn import redis_url_default


def add_redis_url(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--redis-url",
        default=redis_url_default(),
        metavar="URL",
        help="default: $WARMFLEET_REDIS_URL, else redis://127.0.0.1:6379/0",
    )


def add_compute(p: argparse.ArgumentParser) -> None:
    """--device, --dtype, --weights, --kv-dtype and --threads: where and how the model
    runs."""
    add_device(p)
    p.add_argument(
        "--dtype",
        choices=["float32", "float16"],
        default="float32",
        help="compute dtype (float16 is meant for the GPU)",
    )
    add_weights(p)
    add_kv_dtype(p)
    p.add_argument(
        "--threads",
        type=int,
        default=env_int("WARMFLEET_THREADS"),
        metavar="N",
        help="BLAS/kernel threads (default: $WARMFLEET_THREADS, else one per core)",
    )


def add_device(p: argparse.ArgumentParser, *, passed_on: bool = False) -> None:
    """--device; `passed_on`: the command hands it to workers (None: theirs by default)."""
    p.add_argument(
        "--device",
        choices=DEVICES,
        default=None if passed_on else "auto",
        help="cpu: NumPy and the C kernels; cuda: CuPy (pip install 'warmfleet[gpu]'); mlx: "
        "MLX, Metal on a Mac, its CPU build elsewhere (pip install 'warmfleet[mlx]'); auto: "
        "cuda when a GPU is seen, mlx on Apple silicon, else cpu (default: auto)",
    )


def add_weights(p: argparse.ArgumentParser, *, passed_on: bool = False) -> None:
    """--weights; `passed_on`: the command hands it to workers, which read the environment
    themselves when it is not given."""
    from engine.loader.weights import WEIGHT_MODES  # here: the engine's import is for its commands

    help = (
        "quantized: matrices stay in the GGUF's blocks (CPU and CUDA kernels, float32 "
        "compute); float32: expanded at load (to float16 with --dtype float16); auto: "
        "quantized where a kernel reads every matrix type and the dtype is float32"
    )
    _add_auto_choice(p, "--weights", WEIGHT_MODES, "WARMFLEET_WEIGHTS", help, passed_on)


def add_kv_dtype(p: argparse.ArgumentParser, *, passed_on: bool = False) -> None:
    """--kv-dtype, as add_weights."""
    from engine.model import KV_DTYPES  # here: the engine's import is for its commands

    help = (
        "what the KV pool holds: float16 halves a session's bytes, q8_0 (blocks of 32 "
        "values: 8.5 bits a value) takes 0.27x float32's (CPU with float32 compute: the "
        "attention kernels widen each value as they read it); auto: float16 there, the "
        "compute dtype elsewhere"
    )
    _add_auto_choice(p, "--kv-dtype", KV_DTYPES, "WARMFLEET_KV_DTYPE", help, passed_on)


def _add_auto_choice(
    p: argparse.ArgumentParser,
    flag: str,
    choices: tuple[str, ...],
    env: str,
    help: str,
    passed_on: bool,
) -> None:
    """A flag of `choices` defaulting to $env, else auto; None where `passed_on` (the
    workers it is handed to read the environment themselves)."""
    p.add_argument(
        flag,
        choices=choices,
        default=None if passed_on else os.environ.get(env, "auto"),
        help=f"{help} (default: ${env}, else auto)",
    )


def default_spill_dir() -> str:
    return os.environ.get(
        "WARMFLEET_SPILL_DIR", str(Path.home() / ".cache" / "warmfleet" / "spill")
    )


def add_spill_dir(p: argparse.ArgumentParser, *, allow_none: bool = True) -> None:
    none = "; 'none' forgets evicted sessions instead" if allow_none else ""
    p.add_argument(
        "--spill-dir",
        default=default_spill_dir(),
        metavar="DIR",
        help="where evicted sessions are written, shared by the workers and the kvstore "
        f"of a host (default: $WARMFLEET_SPILL_DIR, else ~/.cache/warmfleet/spill){none}",
    )


def add_metrics(p: argparse.ArgumentParser) -> None:
    """--metrics-port and --metrics-host: where the part serves Prometheus metrics."""
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (0: none; `warmfleet up` "
        "gives each part a free port)",
    )
    p.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address the metrics listen on (0.0.0.0 for a Prometheus on another host or "
        "container)",
    )


def serve_metrics(args: argparse.Namespace, serve: Callable[[str, int], int]) -> None:
    """Start the part's metrics server when a port is given (ServiceError if it cannot
    listen); logs where."""
    if not args.metrics_port:
        return
    where = f"{args.metrics_host}:{args.metrics_port}"
    if not 0 < args.metrics_port <= 65535:
        raise InvalidRequestError("--metrics-port", f"must be in [0, 65535], got {where}")
    try:
        port = serve(args.metrics_host, args.metrics_port)
    except OSError as e:
        raise ServiceError(f"cannot serve metrics on {where}: {e}") from e
    logging.info("metrics at http://%s:%d/metrics", args.metrics_host, port)
