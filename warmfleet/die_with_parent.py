"""`python -m warmfleet.die_with_parent PARENT_PID PROGRAM [ARGS...]`: ask the kernel to
SIGKILL this process when PARENT_PID's spawning thread ends, then become PROGRAM (the
request survives exec). The launcher starts every child through it (Linux).

Why not `preexec_fn`: Python code between fork and exec makes subprocess fork for real,
which runs the parent's fork handlers in the child; gRPC's restart its event engine there,
and a child of a process that had used gRPC could abort before exec (seen in CI: a worker
killed by SIGABRT, "epoll_wait error: Bad file descriptor"). Without preexec_fn the child
is spawned without them, and this small program sets the signal itself."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def main(argv: list[str]) -> None:
    parent, program = int(argv[0]), argv[1:]
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    if prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        sys.exit(f"die_with_parent: prctl failed: {os.strerror(ctypes.get_errno())}")
    if os.getppid() != parent:  # the parent died before the request took effect
        sys.exit(1)
    os.execvp(program[0], program)


if __name__ == "__main__":
    main(sys.argv[1:])
