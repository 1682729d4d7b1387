"""Options that several subcommands share, defined once."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from engine.weights import WEIGHT_MODES
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
    """--device, --dtype, --weights and --threads: where and how the model runs."""
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="cuda uses CuPy; auto uses it when a GPU is seen",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "float16"],
        default="float32",
        help="compute dtype (float16 is meant for the GPU)",
    )
    add_weights(p)
    p.add_argument(
        "--threads",
        type=int,
        default=env_int("WARMFLEET_THREADS"),
        metavar="N",
        help="BLAS/kernel threads (default: $WARMFLEET_THREADS, else one per core)",
    )


def add_weights(p: argparse.ArgumentParser, *, passed_on: bool = False) -> None:
    """--weights; `passed_on`: the command hands it to workers, which read the environment
    themselves when it is not given."""
    p.add_argument(
        "--weights",
        choices=WEIGHT_MODES,
        default=None if passed_on else os.environ.get("WARMFLEET_WEIGHTS", "auto"),
        help="quantized: matrices stay in the GGUF's blocks (CPU kernels); float32: expanded "
        "at load (the GPU path always expands, to --dtype); auto: quantized where a kernel "
        "reads every matrix type (default: $WARMFLEET_WEIGHTS, else auto)",
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
