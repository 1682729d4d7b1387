"""Child processes: spawn with a log file, stop with a deadline, read the tail of a log."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

Process = subprocess.Popen[bytes]
PRIVATE_PORTS_FROM = 20000  # free_port draws from here up to the ephemeral range


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, for a child to listen on.

    Drawn below the kernel's ephemeral range: a port the kernel handed out (bind to port 0)
    can be handed out again to any outgoing connection before the child binds it, seconds
    later, while ports below the range are only ever taken by listeners that ask for them."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(PRIVATE_PORTS_FROM, low) if low > PRIVATE_PORTS_FROM + 1000 else 0
        if port in _handed_out:  # free now, but promised to a child that has not bound it yet
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            found: int = s.getsockname()[1]
        if found not in _handed_out:  # port 0's answer, where there is no range below
            _handed_out.add(found)
            return found
    raise OSError("no free TCP port on 127.0.0.1")


# Every port free_port returned in this process: two draws for one cluster (its gRPC and
# HTTP ports, say) must differ, and at 12,000 ports to draw from, a suite starting a few
# hundred children drew the same port twice about once in eight runs (the second child then
# failed with "Address already in use"). A few hundred ints a day of restarts at most.
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 49152 elsewhere, IANA's)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def port_is_free(port: int) -> bool:
    """True if a listener could bind 127.0.0.1:`port` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is ok
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def spawn(
    argv: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    *,
    die_with_parent: bool = True,
) -> Process:
    """Start `argv` with stdout and stderr appended to `log_path` and stdin closed.

    The child gets a session of its own, so a Ctrl-C in the terminal reaches only the
    launcher, which then stops its children in order. With `die_with_parent` (Linux), the
    kernel SIGKILLs the child when the thread that spawned it ends, however the launcher
    dies: spawn from the thread that lives as long as the children should (the main one).
    The child sets that up itself, after exec (warmfleet/die_with_parent.py says why)."""
    argv = list(argv)
    if die_with_parent and sys.platform.startswith("linux"):
        argv = [sys.executable, "-m", "warmfleet.die_with_parent", str(os.getpid()), *argv]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            start_new_session=True,
        )


def signal_process(proc: Process, signum: int) -> None:
    """Send `signum` to `proc` unless it has already exited and been reaped."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)


def wait_exit(proc: Process, timeout_s: float) -> int | None:
    """Wait up to `timeout_s` for `proc` to exit; its exit code, or None if it still runs."""
    try:
        return proc.wait(timeout=max(0.0, timeout_s))
    except subprocess.TimeoutExpired:
        return None


def kill(proc: Process, timeout_s: float = 5.0) -> int | None:
    """SIGKILL `proc` and reap it; its exit code (None only if the kernel never reaps it)."""
    signal_process(proc, signal.SIGKILL)
    return wait_exit(proc, timeout_s)


def terminate(proc: Process, timeout_s: float) -> int | None:
    """SIGTERM `proc`, wait up to `timeout_s`, then SIGKILL it; its exit code."""
    signal_process(proc, signal.SIGTERM)
    code = wait_exit(proc, timeout_s)
    return code if code is not None else kill(proc)


def terminate_all(
    procs: Mapping[str, Process], timeout_s: float, *, again_after_s: float | None = None
) -> list[str]:
    """SIGTERM every process together, SIGTERM again (a second signal: stop now) those still
    running `again_after_s` later, and SIGKILL those still running at `timeout_s`, then reap
    them; the names of those killed."""
    start = time.monotonic()
    running = dict(procs)
    steps = [(0.0, signal.SIGTERM), (timeout_s, signal.SIGKILL)]
    if again_after_s is not None and again_after_s < timeout_s:
        steps.insert(1, (again_after_s, signal.SIGTERM))
    for at_s, signum in steps:
        for p in running.values():
            wait_exit(p, start + at_s - time.monotonic())
        running = {name: p for name, p in running.items() if p.poll() is None}
        for p in running.values():
            signal_process(p, signum)
    for p in running.values():
        wait_exit(p, 5.0)
    return list(running)


def tail(path: Path, num_lines: int = 20, max_bytes: int = 64 * 1024) -> list[str]:
    """The last `num_lines` lines of a log file (empty if it is missing)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-num_lines:]


def describe_exit(code: int) -> str:
    """'exited with code 1' or 'was killed by SIGKILL'."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def format_tail(path: Path, num_lines: int = 20) -> str:
    """The tail of a log, indented, under a header line naming the file."""
    lines = tail(path, num_lines)
    if not lines:
        return f"(its log {path} is empty)"
    body = "\n".join(f"    {line}" for line in lines)
    return f"last lines of {path}:\n{body}"
