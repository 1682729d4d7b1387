"""Build and run the gateway's gRPC server: Inference, health and reflection."""

from __future__ import annotations

from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from broker.gateway_broker import GatewayBroker
from engine.config import ModelConfig
from engine.tokenizer import Tokenizer
from gateway.service import GatewayConfig, InferenceService
from warmfleet.v1 import inference_pb2, inference_pb2_grpc

SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name


def build_server(
    broker: GatewayBroker,
    tokenizer: Tokenizer,
    model_config: ModelConfig,
    config: GatewayConfig,
    address: str,
    max_streams: int,
) -> tuple[grpc.Server, int]:
    """A started server bound to `address` ("host:port", port 0 picks one); returns the port."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_streams), maximum_concurrent_rpcs=max_streams
    )
    inference_pb2_grpc.add_InferenceServicer_to_server(
        InferenceService(broker, tokenizer, model_config, config), server
    )
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port
