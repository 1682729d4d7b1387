"""A gateway whose Redis is unreachable says NOT_SERVING, and answers UNAVAILABLE before the
client's deadline: it never hangs."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from warmfleet.client import Client
from warmfleet.probes import HealthProbe
from warmfleet.processes import Process, free_port, kill, spawn


@pytest.fixture(scope="module")
def gateway(
    default_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    port, http_port, dead_redis = free_port(), free_port(), free_port()  # nothing on dead_redis
    log = tmp_path_factory.mktemp("gw") / "gateway.log"
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
            str(default_model_path),
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
        yield target, f"http://127.0.0.1:{http_port}"
    finally:
        probe.close()
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
