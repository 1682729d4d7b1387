"""The gateway process: one event loop, two faces. grpc.aio serves `warmfleet.v1.Inference`
(with health and reflection), uvicorn serves the HTTP APIs, and both run over one
GatewayCore. No thread per stream: an open stream is a task and a queue."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import redis.asyncio as aioredis
import uvicorn

from broker.gateway_broker import GatewayBroker
from broker.results_hub import ResultsHub
from common.grpc_guard import RequestGuard, SizeCheck
from common.grpc_serve import serve_async
from common.v1 import inference_pb2, inference_pb2_grpc
from engine.text.model_config import ModelConfig
from engine.text.tokenizer import Tokenizer
from gateway.auth import KeyRing
from gateway.core import GatewayConfig, GatewayCore
from gateway.dashboard import Operator
from gateway.fleet_sampler import FleetSampler
from gateway.grpc_api import InferenceService
from gateway.grpc_calls import CountStatuses
from gateway.http_app import build_app
from gateway.http_jobs import HttpContext
from gateway.memory import HeapTrimmer, NoteLargeBodies, freeze_startup
from gateway.metrics import GatewayMetrics
from gateway.validate import JobBuilder
from gateway.work_gate import LARGE_BYTES, WorkGate
from gateway.worker_watch import WorkerWatch

log = logging.getLogger("warmfleet.gateway")
SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name
SPARE_CONNECTIONS = 64  # HTTP connections beyond --max-streams (idle keep-alive ones count)


@dataclass(frozen=True, slots=True)
class Listen:
    host: str
    grpc_port: int
    http_port: int
    max_body_bytes: int = 4 << 20  # an HTTP body's
    max_streams: int = 4096  # open calls at most, each face
    max_message_bytes: int = 16 << 20  # a gRPC request message's


def http_socket(host: str, port: int) -> socket.socket:
    """The HTTP face's listening socket (OSError if the port is taken). TCP_NODELAY, which
    the connections it accepts inherit: a response written as its head and then its body
    is not held back by Nagle for the client's delayed ACK (40 ms a response otherwise)."""
    sock = socket.create_server((host, port), reuse_port=False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the gateway stops both faces itself."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Gateway:
    def __init__(
        self,
        r: aioredis.Redis,
        tokenizer: Tokenizer,
        model_config: ModelConfig,
        thoughts: bool,  # replies are read for a think span (--reasoning-parser)
        config: GatewayConfig,
        keys: KeyRing,
        model_names: tuple[str, ...],
    ) -> None:
        broker = GatewayBroker(r)
        self.watch = WorkerWatch(broker)
        self.hub = ResultsHub(r)
        self.metrics = GatewayMetrics(lambda: self.sampler.latest)
        self.sampler = FleetSampler(r, self.metrics)
        self.core = GatewayCore(broker, self.hub, config, self.watch, self.metrics)
        self.trimmer = HeapTrimmer()
        gate = WorkGate(on_large=self.trimmer.note)
        self.jobs = JobBuilder(tokenizer, model_config, config.default_timeout_s, gate, thoughts)
        self.keys = keys
        self.model_names = model_names
        self._grpc: grpc.aio.Server | None = None
        self._http: _Uvicorn | None = None
        self._http_task: asyncio.Task[None] | None = None

    async def start(self, listen: Listen) -> tuple[int, int]:
        """Both faces listening (OSError if a port is taken); their ports. Health says
        SERVING once a worker takes requests."""
        service = InferenceService(self.core, self.jobs, self.keys)
        add = inference_pb2_grpc.add_InferenceServicer_to_server
        address = f"{listen.host}:{listen.grpc_port}"
        calls = CountStatuses(self.metrics, listen.max_streams)
        self._grpc, grpc_port, health = await serve_async(
            [(add, service, SERVICE_NAME)], address, [calls],
            max_message_bytes=listen.max_message_bytes, guard=RequestGuard(self._size_checks()),
        )  # fmt: skip

        async def set_health(serving: bool) -> None:
            status = 1 if serving else 2  # SERVING, NOT_SERVING
            for name in ("", SERVICE_NAME):
                await health.set(name, status)

        self.watch.on_change = lambda serving: asyncio.ensure_future(set_health(serving))
        await self.watch.start()
        self.hub.start()
        self.sampler.start()
        self.trimmer.start()
        sock = http_socket(listen.host, listen.http_port)
        ctx = HttpContext(self.core, self.jobs, self.keys, self.model_names, listen.max_body_bytes)
        operator = Operator(self.core, self.keys, self.sampler)
        app = NoteLargeBodies(build_app(ctx, operator, listen.max_streams), self.trimmer.note)
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            # connections, idle ones too: past these uvicorn answers 503 itself
            limit_concurrency=listen.max_streams + SPARE_CONNECTIONS,
            timeout_graceful_shutdown=10,
        )
        self._http = _Uvicorn(config)
        self._http_task = asyncio.ensure_future(self._http.serve(sockets=[sock]))
        freeze_startup()
        return grpc_port, sock.getsockname()[1]

    async def stop(self, grace_s: float) -> None:
        """Stop taking calls, let open streams finish for up to `grace_s`, then close."""
        await self.sampler.stop()  # ends the dashboards' streams, which never end otherwise
        if self._http is not None:
            self._http.should_exit = True
        if self._grpc is not None:
            await self._grpc.stop(grace_s)
        if self._http_task is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._http_task, grace_s + 1)
        await self.watch.stop()
        await self.hub.stop()
        await self.trimmer.stop()
        self.jobs.gate.close()

    def _size_checks(self) -> dict[str, SizeCheck]:
        """Generate requests too large to hold a prompt that fits: refused undecoded."""
        bounds = self.jobs.bounds

        def check(num_bytes: int) -> str | None:
            why = bounds.check_request(num_bytes)
            if why is not None or num_bytes >= LARGE_BYTES:
                self.trimmer.note()  # its bytes are freed once refused or read
            return why

        return {f"/{SERVICE_NAME}/Generate": check}
