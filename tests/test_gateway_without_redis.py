"""A gateway whose Redis is unreachable says NOT_SERVING, and answers UNAVAILABLE before the
client's deadline: it never hangs."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from warmfleet.client import Client
from warmfleet.commands.gateway import DRAIN_S
from warmfleet.probes import HealthProbe
from warmfleet.processes import Process, free_port, kill, spawn, wait_exit


def start_gateway(model: Path, log: Path) -> tuple[Process, str, str]:
    """A gateway whose Redis URL has nothing behind it, once it answers NOT_SERVING; its
    process, gRPC target and HTTP URL."""
    port, http_port, dead_redis = free_port(), free_port(), free_port()  # nothing on dead_redis
    proc: Process = spawn(
        [
            sys.executable,
            "-m",
            "warmfleet.cli",
            "gateway",
            "--redis-url",
            f"redis://127.0.0.1:{dead_redis}/0",
            "--port",
            str(port),
            "--http-port",
            str(http_port),
            "--model",
            str(model),
        ],
        log,
    )
    target = f"127.0.0.1:{port}"
    probe = HealthProbe(target)
    try:
        deadline = time.monotonic() + 60
        while (reason := probe.not_serving_reason()) != "health: NOT_SERVING":
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"gateway not answering after 60 s: {reason}"
            time.sleep(0.2)
    except BaseException:
        kill(proc)
        raise
    finally:
        probe.close()
    return proc, target, f"http://127.0.0.1:{http_port}"


@pytest.fixture(scope="module")
def gateway(
    default_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    log = tmp_path_factory.mktemp("gw") / "gateway.log"
    proc, target, http_url = start_gateway(default_model_path, log)
    try:
        yield target, http_url
    finally:
        kill(proc)


@pytest.mark.parametrize("deadline_s", [2.0, 5.0])
def test_requests_fail_unavailable_within_their_deadline(
    gateway: tuple[str, str], deadline_s: float
) -> None:
    with Client(gateway[0]) as client:
        with pytest.raises(grpc.RpcError) as err:
            client.complete("s", prompt="hello", max_tokens=4, timeout_s=deadline_s)
        # the gateway's own answer: had it hung, the client would see DEADLINE_EXCEEDED
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
        assert "queue unavailable" in err.value.details()
        for call in (lambda: client.get_session("s"), lambda: client.delete_session("s")):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_http_requests_get_503_in_each_apis_shape(gateway: tuple[str, str]) -> None:
    chat = [{"role": "user", "content": "hi"}]
    with httpx.Client(base_url=gateway[1], timeout=30) as http:
        r = http.post("/v1/chat/completions", json={"messages": chat, "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
        assert "queue unavailable" in r.json()["error"]["message"]
        r = http.post("/v1/messages", json={"messages": chat, "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error"
        assert http.get("/v1/sessions").status_code == 503


def test_sigterm_stops_it_cleanly_without_redis(default_model_path: Path, tmp_path: Path) -> None:
    """Its way out touches Redis too (the results reader's wake stream): unreachable, that is
    a line in the log, not a traceback and an exit code of 1."""
    log = tmp_path / "gateway.log"
    proc, _, _ = start_gateway(default_model_path, log)
    try:
        proc.send_signal(signal.SIGTERM)
        code = wait_exit(proc, DRAIN_S)  # no stream is open: nothing to wait for
    finally:
        kill(proc)
    text = log.read_text()
    assert code == 0, text
    assert "Traceback" not in text, text
    assert text.rstrip().endswith("gateway: stopped"), text
    assert "results reader: wake stream wf:hub:" in text  # left behind, and said so
