"""`warmfleet up` end to end with stand-in workers and gateway: ready banner, demo, signals."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fake_cluster import CLI_MODULE, child_env
from warmfleet.cluster_config import ClusterConfig
from warmfleet.commands import up
from warmfleet.launcher import Cluster
from warmfleet.processes import free_port
from warmfleet.stop_signals import StopNow, StopRequested, StopSignals


def fake_clusters(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str] | None = None
) -> list[Cluster]:
    """Make `up` build clusters of stand-ins; returns the list they are recorded in."""
    made: list[Cluster] = []

    def factory(config: ClusterConfig) -> Cluster:
        cluster = Cluster(
            dataclasses.replace(
                config,
                cli_module=CLI_MODULE,
                extra_env=child_env(**(env or {})),
                log_dir=tmp_path / "logs",
            )
        )
        made.append(cluster)
        return cluster

    monkeypatch.setattr(up, "Cluster", factory)
    return made


@contextlib.contextmanager
def signal_when(condition: Callable[[], bool], timeout_s: float = 60.0) -> Iterator[None]:
    """SIGTERM this process once `condition()` holds (or after `timeout_s`) while the block
    runs; none once it has ended (a later test's process would be the one stopped)."""
    ended = threading.Event()

    def wait_then_signal() -> None:
        deadline = time.monotonic() + timeout_s
        while not condition() and time.monotonic() < deadline:
            if ended.wait(0.05):
                return
        if not ended.is_set():
            os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=wait_then_signal, daemon=True)
    thread.start()
    try:
        yield
    finally:
        ended.set()
        thread.join()


def ports() -> list[str]:
    """Free ports for every listener `up` starts (none left to its defaults: a machine may
    use those)."""
    names = ("--port", "--http-port", "--kvstore-port")
    return [arg for name in names for arg in (name, str(free_port()))]


def run_up(argv: list[str]) -> int:
    from warmfleet.cli import build_parser

    args = build_parser().parse_args(["up", *argv])
    return int(args.run(args))


def test_up_demo_then_sigterm_stops_cleanly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made = fake_clusters(monkeypatch, tmp_path)
    stdout = io.StringIO()
    monkeypatch.setattr("sys.stdout", stdout)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    listen = ports()
    port, http_port = listen[1], listen[3]
    with signal_when(lambda: stdout.getvalue().count("[demo-") >= 8):  # 4 turns, 2 lines each
        code = run_up(["--workers", "2", *listen, "--demo", "--model", str(model)])
    assert code == 0
    out = stdout.getvalue()
    addresses = f"gRPC 127.0.0.1:{port} · HTTP http://127.0.0.1:{http_port} · workers w0, w1"
    assert f"warmfleet is up: {addresses}" in out
    assert "· kvstore 127.0.0.1:" in out
    assert f"try: warmfleet chat --session demo --target 127.0.0.1:{port}" in out
    assert "[demo-a] user: What is the capital of France?" in out
    assert "[demo-b · fake · cached 0/" in out  # the stand-in's worker id, first turn cold
    # the two sessions talk at once: only the line after demo-a's second question is its reply
    second_reply = out.split("[demo-a] user: And which river runs through it?\n")[1]
    second_reply = second_reply.splitlines()[0]
    assert second_reply.startswith("[demo-a · fake · cached ") and "cached 0/" not in second_reply
    assert "stopping..." in capsys.readouterr().err
    (cluster,) = made
    assert {n: p.returncode for n, p in cluster.processes.items() if n != "redis"} == {
        "w0": 0,
        "w1": 0,
        "gateway": 0,
        "kvstore": 0,
    }


def test_a_signal_during_start_stops_everything(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    made = fake_clusters(monkeypatch, tmp_path, env={"FAKE_SILENT": "w0"})  # never ready
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with signal_when(lambda: bool(made) and "w0" in made[0].processes):
        code = run_up(["--workers", "1", *ports(), "--model", str(model)])
    assert code == 130
    assert all(p.poll() is not None for p in made[0].processes.values())


def test_up_starts_a_killed_worker_again_and_still_stops_cleanly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made = fake_clusters(monkeypatch, tmp_path)
    stdout = io.StringIO()
    monkeypatch.setattr("sys.stdout", stdout)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    killed: list[int] = []

    def back_again() -> bool:
        """Kill w0 once `up` is up; true once its successor runs (it logged its start)."""
        if "warmfleet is up" not in stdout.getvalue():
            return False
        w0 = made[0].processes["w0"]
        if not killed:
            killed.append(w0.pid)
            os.kill(w0.pid, signal.SIGKILL)
        return w0.pid != killed[0] and made[0].log_path("w0").read_text().count("argv") == 2

    with signal_when(back_again):
        code = run_up(["--workers", "2", *ports(), "--model", str(model)])
    assert code == 0
    err = capsys.readouterr().err
    assert "w0 was killed by SIGKILL after " in err
    assert "; starting it again in 0.5 s (restart 1)" in err
    (cluster,) = made
    assert f"w0 started again (pid {cluster.processes['w0'].pid})" in err
    assert cluster.processes["w0"].pid != killed[0]
    assert {n: p.returncode for n, p in cluster.processes.items() if n != "redis"} == {
        "w0": 0,
        "w1": 0,
        "gateway": 0,
        "kvstore": 0,
    }  # the stop restarted nothing it stopped


def test_first_signal_asks_second_insists() -> None:
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where pytest runs in the background
    signals = StopSignals().install()
    try:
        assert not signals.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.requested and not signals.urgent
        with pytest.raises(StopNow):
            os.kill(os.getpid(), signal.SIGINT)
        assert signals.urgent
    finally:
        signals.restore()
    assert signal.getsignal(signal.SIGINT) is before


def test_interruptible_raises_on_the_first_signal() -> None:
    signals = StopSignals().install()
    try:
        with pytest.raises(StopRequested), signals.interruptible():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # interrupted by the handler
        with pytest.raises(StopRequested), signals.interruptible():
            pass  # a stop already requested: leave at once
    finally:
        signals.restore()


def test_bad_arguments_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    from warmfleet.cli import main

    assert main(["up", "--workers", "0"]) == 2
    assert capsys.readouterr().err == "warmfleet: error: --workers: must be at least 1, got 0\n"


def _children(pid: int) -> dict[int, str]:
    """The live processes whose parent is `pid`, with their command names (Linux /proc)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            name = stat.read_text().split("(", 1)[1].rsplit(")", 1)[0]
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found[int(stat.parent.name)] = name
    return found


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_up_killed_with_sigkill_leaves_no_process_behind(
    default_model_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "up.out"
    argv = [sys.executable, "-m", "warmfleet.cli", "up", "--workers", "1", *ports()]
    argv += ["--model", str(default_model_path), "--spill-dir", str(tmp_path / "spill")]
    with out.open("wb") as f:
        up_process = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while "warmfleet is up" not in out.read_text():
            assert up_process.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        children = _children(up_process.pid)
        assert sorted(children.values()).count("redis-server") == 1, children
        assert len(children) == 4, children  # redis-server, the kvstore, w0, the gateway
    finally:
        up_process.kill()
        up_process.wait()
    deadline = time.monotonic() + 30
    while left := [pid for pid in children if _running(pid)]:
        assert time.monotonic() < deadline, {pid: children[pid] for pid in left}
        time.sleep(0.1)
