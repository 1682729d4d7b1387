"""Waiting for the parts `warmfleet up` started to be ready: a worker when it has written a
fresh heartbeat, the gateway and the kvstore when their gRPC health says SERVING. A part
that exits first, or a deadline that passes, is a ServiceError with the end of its log."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import redis

from common.errors import ServiceError
from warmfleet.probes import HealthProbe, HeartbeatMark, heartbeat_is_fresh
from warmfleet.processes import Process, describe_exit, format_tail
from warmfleet.stop_signals import StopRequested

POLL_S = 0.1


@dataclass(slots=True)
class Child:
    name: str
    argv: list[str]
    grpc_target: str = ""  # gateway and kvstore: ready when its health check says SERVING
    process: Process | None = None
    mark: HeartbeatMark | None = None  # workers: the heartbeat key before this start


def wait_ready(
    children: list[Child],
    deadline: float,
    redis_client: redis.Redis,
    log_path: Callable[[str], Path],
    progress: Callable[[str], None],
    also_alive: Process | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> None:
    """Poll until every child is ready; `also_alive` (the private Redis) must not exit.
    Raises StopRequested as soon as `should_stop()` says so."""
    t0 = time.monotonic()
    pending = {c.name: c for c in children}
    reasons: dict[str, str] = {}
    progress(f"waiting for {', '.join(pending)} (each loads the model)")
    probes = {c.name: HealthProbe(c.grpc_target) for c in children if c.grpc_target}
    try:
        while pending:
            if should_stop():
                raise StopRequested
            _raise_if_exited(pending.values(), also_alive, log_path)
            for name, child in list(pending.items()):
                reason = _not_ready_reason(child, probes.get(name), redis_client)
                if reason is None:
                    del pending[name]
                    progress(f"{name} ready after {time.monotonic() - t0:.1f} s")
                else:
                    reasons[name] = reason
            if pending and time.monotonic() >= deadline:
                waited = ", ".join(f"{n} ({reasons.get(n, 'not checked')})" for n in pending)
                tails = "\n".join(f"{n}: {format_tail(log_path(n), 10)}" for n in pending)
                raise ServiceError(
                    f"not ready after {time.monotonic() - t0:.0f} s: {waited}\n{tails}"
                )
            if pending:
                time.sleep(POLL_S)
    finally:
        for probe in probes.values():
            probe.close()


def _raise_if_exited(
    children: Iterable[Child], redis_process: Process | None, log_path: Callable[[str], Path]
) -> None:
    if redis_process is not None and (code := redis_process.poll()) is not None:
        raise ServiceError(f"redis-server {describe_exit(code)}; {format_tail(log_path('redis'))}")
    for child in children:
        assert child.process is not None
        if (code := child.process.poll()) is not None:
            log = format_tail(log_path(child.name))
            raise ServiceError(f"{child.name} {describe_exit(code)} before it was ready; {log}")


def _not_ready_reason(
    child: Child, health: HealthProbe | None, redis_client: redis.Redis
) -> str | None:
    if health is not None:
        return health.not_serving_reason()
    assert child.mark is not None
    try:
        fresh = heartbeat_is_fresh(redis_client, child.name, child.mark)
    except redis.RedisError as e:
        return f"redis: {e}"
    return None if fresh else "no heartbeat yet"
