"""Build and run the gateway's gRPC server: Inference, health and reflection."""

from __future__ import annotations

import grpc

from broker.gateway_broker import GatewayBroker
from common.grpc_serve import serve, set_health
from common.v1 import inference_pb2, inference_pb2_grpc
from engine.config import ModelConfig
from engine.tokenizer import Tokenizer
from gateway.auth import KeyRing
from gateway.core import GatewayConfig, GatewayCore
from gateway.service import InferenceService
from gateway.worker_watch import WorkerWatch

SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name


def build_server(
    broker: GatewayBroker,
    tokenizer: Tokenizer,
    model_config: ModelConfig,
    config: GatewayConfig,
    address: str,
    max_streams: int,
    keys: KeyRing | None = None,
) -> tuple[grpc.Server, int, WorkerWatch]:
    """A started server bound to `address` ("host:port", port 0 picks one); returns it, the
    port, and the watch of live workers that its health follows (NOT_SERVING while no
    worker takes requests). Stop the watch after the server."""
    watch = WorkerWatch(broker, lambda serving: None)
    core = GatewayCore(broker, config, watch)
    service = InferenceService(core, tokenizer, model_config, keys or KeyRing.open())
    add = inference_pb2_grpc.add_InferenceServicer_to_server
    server, port, health = serve([(add, service, SERVICE_NAME)], address, max_streams,
                                 serving=False)  # fmt: skip
    watch.on_change = lambda serving: set_health(health, ["", SERVICE_NAME], serving)
    watch.start()
    return server, port, watch
