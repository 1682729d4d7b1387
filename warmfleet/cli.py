"""The `warmfleet` command: subcommands grow with the project."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from common.errors import WarmfleetError
from warmfleet import __version__

# in the order `--help` lists them; each is warmfleet.commands.<name>, imported only when
# needed: a compose healthcheck (`warmfleet health`, every few seconds) does not pay for
# importing the engine
COMMANDS = ("up", "chat", "gateway", "worker", "kvstore", "keys", "generate", "model", "top",
            "health", "doctor")  # fmt: skip
COMPUTING = ("worker", "generate", "doctor")  # they run the model in this process


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or (`only`) the one subcommand that is being run."""
    parser = _Parser(prog="warmfleet", description=__doc__)
    parser.add_argument("--version", action="version", version=f"warmfleet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMANDS if only is None else (only,):
        importlib.import_module(f"warmfleet.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    if command in COMPUTING:  # before its module loads NumPy and Numba; the others never do
        from engine.thread_env import prepare_process

        prepare_process()
    args = build_parser(command).parse_args(argv)
    try:
        return int(args.run(args))
    except WarmfleetError as e:
        print(f"warmfleet: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
