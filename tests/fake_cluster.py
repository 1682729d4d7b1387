"""Stand-ins for `warmfleet worker` and `warmfleet gateway`, for tests of the launcher and clients.

`python -m tests.fake_cluster worker|gateway ...` takes the real commands' arguments. The fake
worker only keeps its heartbeat key; the fake gateway answers the health check and serves
`FakeInference`, which echoes the last message one character per token. Environment switches:
`FAKE_EXIT=<name>:<code>` makes that child exit early with the code, `FAKE_IGNORE_TERM=<name>`
makes it ignore SIGTERM, and `FAKE_SILENT=<name>` makes that worker never write its heartbeat.
Each child prints "<name>: stopped at <unix time>" when SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import redis
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from broker.keys import heartbeat_key
from common.v1 import inference_pb2 as pb
from common.v1 import inference_pb2_grpc

HEARTBEAT_TTL_S = 3
ROOT = Path(__file__).resolve().parents[1]
CLI_MODULE = "tests.fake_cluster"


def child_env(**extra: str) -> dict[str, str]:
    """Environment for the stand-ins: the repository importable, plus `extra` switches."""
    return {"PYTHONPATH": str(ROOT), **extra}


class FakeInference(inference_pb2_grpc.InferenceServicer):
    """Replies "echo: <last input text>", one character per token id (its code point)."""

    def __init__(self, worker_id: str = "fake", chunk_delay_s: float = 0.0) -> None:
        self.worker_id = worker_id
        self.chunk_delay_s = chunk_delay_s
        self.requests: list[pb.GenerateRequest] = []
        self._prompts: dict[str, str] = {}
        self._sessions: dict[str, pb.Session] = {}
        self._lock = threading.Lock()

    def Generate(self, request: pb.GenerateRequest, context: Any) -> Iterator[pb.GenerateResponse]:
        self.requests.append(request)
        metadata = dict(context.invocation_metadata())
        session_id = request.session_id or metadata.get("x-session-id", "")
        prompt, last = _prompt_of(request, context)
        max_tokens = request.max_tokens if request.HasField("max_tokens") else 256
        if max_tokens <= 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "max_tokens: must be at least 1")
        full = f"echo: {last}"
        reply = full[:max_tokens]
        with self._lock:
            before = self._prompts.get(session_id, "")
        cached = _common_prefix_len(before, prompt)
        for i in range(0, len(reply), 4):
            if not context.is_active():
                return
            piece = reply[i : i + 4]
            chunk = pb.Chunk(index=i, token_ids=[ord(c) for c in piece], text=piece)
            yield pb.GenerateResponse(chunk=chunk)
            time.sleep(self.chunk_delay_s)
        with self._lock:
            self._prompts[session_id] = prompt + reply
            self._sessions[session_id] = pb.Session(
                session_id=session_id,
                tier=pb.TIER_WARM,
                worker_id=self.worker_id,
                num_tokens=len(prompt) + len(reply),
            )
        yield pb.GenerateResponse(completion=self._completion(request, prompt, reply, full, cached))

    def _completion(
        self, request: pb.GenerateRequest, prompt: str, reply: str, full: str, cached: int
    ) -> pb.Completion:
        return pb.Completion(
            request_id=f"r{len(self.requests)}",
            finish_reason=pb.FINISH_REASON_STOP if reply == full else pb.FINISH_REASON_LENGTH,
            usage=pb.Usage(
                prompt_tokens=len(prompt), cached_tokens=cached, completion_tokens=len(reply)
            ),
            worker_id=self.worker_id,
            kv_source=pb.KV_SOURCE_WARM if cached else pb.KV_SOURCE_COLD,
            seed=request.seed if request.HasField("seed") else 7,
        )

    def GetSession(self, request: pb.GetSessionRequest, context: Any) -> pb.Session:
        with self._lock:
            session = self._sessions.get(request.session_id)
        if session is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"session_id: no session {request.session_id}")
        assert session is not None  # abort() raised otherwise
        return session

    def ListSessions(
        self, request: pb.ListSessionsRequest, context: Any
    ) -> pb.ListSessionsResponse:
        with self._lock:
            ids = sorted(self._sessions)
            start = int(request.page_token or 0)
            end = start + (request.page_size or 100)
            page = [self._sessions[s] for s in ids[start:end]]
        return pb.ListSessionsResponse(
            sessions=page, next_page_token=str(end) if end < len(ids) else ""
        )

    def DeleteSession(
        self, request: pb.DeleteSessionRequest, context: Any
    ) -> pb.DeleteSessionResponse:
        with self._lock:
            self._prompts.pop(request.session_id, None)
            deleted = self._sessions.pop(request.session_id, None) is not None
        return pb.DeleteSessionResponse(deleted=deleted)


def _prompt_of(request: pb.GenerateRequest, context: Any) -> tuple[str, str]:
    """The whole prompt as text, and its last message (what the echo repeats)."""
    kind = request.WhichOneof("input")
    if kind == "messages":
        if not request.messages.messages:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "messages: empty")
        prompt = "".join(f"<{m.role}>{m.content}" for m in request.messages.messages)
        return prompt, request.messages.messages[-1].content
    if kind == "prompt":
        return request.prompt, request.prompt
    if kind == "token_ids":
        text = "".join(map(chr, request.token_ids.ids))
        return text, text
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "input: give messages or prompt")
    raise AssertionError("unreachable")


def _common_prefix_len(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def serve(servicer: FakeInference, port: int = 0) -> tuple[grpc.Server, int]:
    """A started gRPC server with `servicer` and a SERVING health service; and its port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, bound


def _switches(name: str) -> None:
    exit_spec = os.environ.get("FAKE_EXIT", "")
    if exit_spec.split(":")[0] == name:
        print(f"{name}: failing on purpose", flush=True)
        sys.exit(int(exit_spec.split(":")[1]))
    if os.environ.get("FAKE_IGNORE_TERM") == name:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _run_worker(args: argparse.Namespace) -> None:
    _switches(args.worker_id)
    stopping = threading.Event()
    if os.environ.get("FAKE_IGNORE_TERM") != args.worker_id:
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    client = redis.Redis.from_url(args.redis_url, socket_timeout=2.0)
    print(f"{args.worker_id}: argv {json.dumps(sys.argv[1:])}", flush=True)
    silent = os.environ.get("FAKE_SILENT") == args.worker_id
    while not stopping.is_set():
        if not silent:
            status = json.dumps({"pid": os.getpid(), "t": time.time()})
            client.set(heartbeat_key(args.worker_id), status, ex=HEARTBEAT_TTL_S)
        stopping.wait(0.2)
    print(f"{args.worker_id}: stopped at {time.time():.6f}", flush=True)


def _run_grpc(name: str, args: argparse.Namespace) -> None:
    """The gateway or the kvstore: a gRPC server that answers health checks."""
    _switches(name)
    stopping = threading.Event()
    if os.environ.get("FAKE_IGNORE_TERM") != name:
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    server, _ = serve(FakeInference(), args.port)
    print(f"{name}: argv {json.dumps(sys.argv[1:])}", flush=True)
    while not stopping.wait(0.2):
        pass
    server.stop(grace=1.0).wait(2.0)
    print(f"{name}: stopped at {time.time():.6f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="role", required=True)
    worker = sub.add_parser("worker")
    worker.add_argument("--redis-url", required=True)
    worker.add_argument("--worker-id", required=True)
    worker.add_argument("--threads", type=int, required=True)
    worker.add_argument("--model")
    worker.add_argument("--lease-s", type=float)
    worker.add_argument("--spill-dir")
    worker.add_argument("--warm-budget")
    worker.add_argument("--metrics-port", type=int)  # taken, not served
    gateway = sub.add_parser("gateway")
    gateway.add_argument("--redis-url", required=True)
    gateway.add_argument("--port", type=int, required=True)
    gateway.add_argument("--http-port", type=int, required=True)  # taken, not served
    gateway.add_argument("--model")
    kvstore = sub.add_parser("kvstore")
    kvstore.add_argument("--redis-url", required=True)
    kvstore.add_argument("--port", type=int, required=True)
    kvstore.add_argument("--spill-dir")
    kvstore.add_argument("--disk-budget")
    kvstore.add_argument("--metrics-port", type=int)  # taken, not served
    args = parser.parse_args()
    if args.role == "worker":
        _run_worker(args)
    else:
        _run_grpc(args.role, args)


if __name__ == "__main__":
    main()
