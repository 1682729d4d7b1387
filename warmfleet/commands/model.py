"""`warmfleet model pull`: fetch and verify the default model."""

from __future__ import annotations

import argparse
from typing import Any

from warmfleet.models import pull_default_model


def register(sub: Any) -> None:
    p = sub.add_parser("model", help="manage model files")
    msub = p.add_subparsers(dest="model_command", required=True, parser_class=type(p))
    pull = msub.add_parser(
        "pull",
        help="download the default model (SmolLM2-135M-Instruct Q4_1) into the cache "
        "folder ($WARMFLEET_MODEL_DIR, default ~/.cache/warmfleet/models) and check its sha256",
    )
    pull.add_argument("--force", action="store_true", help="download again even if present")
    pull.set_defaults(run=run_pull)


def run_pull(args: argparse.Namespace) -> int:
    print(pull_default_model(force=args.force))
    return 0
