"""Readiness probes for the launcher: a worker's heartbeat in Redis, the gateway's gRPC health."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.keys import heartbeat_key


@dataclass(frozen=True, slots=True)
class HeartbeatMark:
    """A worker's heartbeat key as it was just before the worker was (re)started."""

    value: bytes | None
    ttl_ms: int


def mark_heartbeat(client: redis.Redis, worker_id: str) -> HeartbeatMark:
    """Remember the heartbeat key's value and TTL, so a stale key is not taken for a live one."""
    pipe = client.pipeline(transaction=False)
    pipe.get(heartbeat_key(worker_id))
    pipe.pttl(heartbeat_key(worker_id))
    value, ttl_ms = pipe.execute()
    return HeartbeatMark(value, int(ttl_ms))


def heartbeat_is_fresh(client: redis.Redis, worker_id: str, mark: HeartbeatMark) -> bool:
    """True once the worker has written its heartbeat since `mark` was taken.

    A key left by an earlier process with the same id (killed, or from an earlier run on a
    shared Redis) only counts once it changes: a new value, or a TTL that went up.
    """
    pipe = client.pipeline(transaction=False)
    pipe.get(heartbeat_key(worker_id))
    pipe.pttl(heartbeat_key(worker_id))
    value, ttl_ms = pipe.execute()
    if value is None:
        return False
    if mark.value is None:
        return True
    return bool(value != mark.value or int(ttl_ms) > mark.ttl_ms)


class HealthProbe:
    """Asks a gRPC server's standard health service whether `service` ("" is the server as
    a whole) is SERVING."""

    def __init__(self, target: str, timeout_s: float = 1.0, service: str = "") -> None:
        self._channel = grpc.insecure_channel(target)
        self._stub = health_pb2_grpc.HealthStub(self._channel)
        self._timeout_s = timeout_s
        self._service = service

    def not_serving_reason(self) -> str | None:
        """None when the server answers SERVING within the timeout, else why not (for an
        error message)."""
        try:
            response = self._stub.Check(
                health_pb2.HealthCheckRequest(service=self._service), timeout=self._timeout_s
            )
        except grpc.RpcError as e:
            return f"health check: {e.code().name}"
        if response.status != health_pb2.HealthCheckResponse.SERVING:
            return f"health: {health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)}"
        return None

    def close(self) -> None:
        self._channel.close()
