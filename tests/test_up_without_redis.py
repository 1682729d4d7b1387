"""`warmfleet up` whose private Redis dies, with a stream in flight: every part is stopped at
once (nothing can be handed over without Redis), `up` says so in one line and exits 1 well
before the drain's timeout, the client hears UNAVAILABLE, and no part's log holds a
traceback."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from warmfleet.client import Client
from warmfleet.commands.up import NO_DRAIN, STOP_TIMEOUT_S
from warmfleet.processes import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]
EXIT_WITHIN_S = STOP_TIMEOUT_S * 2 / 3  # the gateway's share of a drain: none is waited out


def start_up(tmp_path: Path, model: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """`warmfleet up` with one worker, its output in a file; returns once it is up."""
    out = tmp_path / "up.out"
    argv = [sys.executable, "-m", "warmfleet.cli", "up", "--workers", "1", "--model", str(model)]
    for option in ("--port", "--kvstore-port", "--http-port"):
        argv += [option, str(free_port())]
    argv += ["--spill-dir", str(tmp_path / "spill")]
    with out.open("wb") as f:
        up = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while "warmfleet is up" not in out.read_text():
        assert up.poll() is None, out.read_text()
        assert time.monotonic() < deadline, out.read_text()
        time.sleep(0.2)
    return up, out


def redis_pid(parent: int) -> int:
    """The pid of the redis-server child of `parent` (Linux /proc)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, fields = text.split("(", 1)[1].rsplit(")", 1)
        if name == "redis-server" and int(fields.split()[1]) == parent:
            return int(stat.parent.name)
    raise AssertionError(f"no redis-server child of {parent}")


def test_up_whose_redis_dies_stops_every_part_at_once(
    default_model_path: Path, tmp_path: Path
) -> None:
    up, out = start_up(tmp_path, default_model_path)
    try:
        banner = out.read_text()
        target = re.search(r"gRPC (\S+)", banner)
        log_dir = re.search(r"· logs (\S+)", banner)
        assert target and log_dir, banner
        with Client(target.group(1)) as client:
            # thousands of tokens: still running on the worker when Redis dies
            call = client.stream(
                "s",
                prompt="Tell me about the sea.",
                max_tokens=4000,
                ignore_eos=True,
                timeout_s=120,
            )
            next(iter(call))
            os.kill(redis_pid(up.pid), signal.SIGKILL)
            with pytest.raises(grpc.RpcError) as ended:
                for _ in call:
                    pass
        code = up.wait(timeout=EXIT_WITHIN_S)
    finally:
        up.kill()
        up.wait()
    text = out.read_text()
    assert code == 1, text
    # the stream ended with the gateway's own answer, not the client's deadline
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, ended.value.details()
    assert f"cannot serve any more, {NO_DRAIN}: redis-server was killed by SIGKILL" in text
    assert text.count(NO_DRAIN) == 1, text
    assert "did not stop in time" not in text, text  # none was killed: each stopped itself
    logs = {
        name: (Path(log_dir.group(1)) / f"{name}.log").read_text()
        for name in ("gateway", "kvstore", "w0")
    }
    for name, log in logs.items():
        assert "Traceback" not in log, f"{name}:\n{log}"
        assert log.rstrip().endswith(("stopped", "stopping now")), f"{name}:\n{log}"
