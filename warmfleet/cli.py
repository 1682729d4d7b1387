"""The `warmfleet` command: subcommands grow with the project."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from common.errors import WarmfleetError
from warmfleet import __version__
from warmfleet.commands import (
    chat,
    doctor,
    gateway,
    generate,
    health,
    keys,
    kvstore,
    model,
    top,
    up,
    worker,
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="warmfleet", description=__doc__)
    parser.add_argument("--version", action="version", version=f"warmfleet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    up.register(sub)
    chat.register(sub)
    gateway.register(sub)
    worker.register(sub)
    kvstore.register(sub)
    keys.register(sub)
    generate.register(sub)
    model.register(sub)
    top.register(sub)
    health.register(sub)
    doctor.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except WarmfleetError as e:
        print(f"warmfleet: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
