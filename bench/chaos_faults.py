"""The faults the chaos script injects, each an async function of the fleet that returns
the part the supervisor must start again (if any) and notes for its row; and a watch that
notes when that part is serving again. A worker's faults hit the busiest worker."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import redis

from bench.chaos_cluster import Fleet, log
from broker.keys import heartbeat_key
from warmfleet.client import KVStoreClient
from warmfleet.probes import HealthProbe
from warmfleet.processes import signal_process

_MIB = 1 << 20
_WATCH_S = 0.2


Injected = tuple[str | None, list[str]]  # (the part to be started again, notes)


@dataclass(frozen=True)
class Fault:
    title: str
    inject: Callable[[Fleet, float], Awaitable[Injected]]


def busiest_worker(fleet: Fleet) -> tuple[str, int]:
    """The worker running the most requests now, by the heartbeats, and how many."""
    assert fleet.cluster is not None
    c = fleet.cluster
    r = redis.Redis.from_url(c.redis_url, socket_timeout=2.0)
    try:
        beats = [r.get(heartbeat_key(w)) for w in c.worker_ids]
    finally:
        r.close()
    running = [json.loads(b)["num_running"] if b else -1 for b in beats]
    i = max(range(len(running)), key=running.__getitem__)
    return c.worker_ids[i], running[i]


def _kill(fleet: Fleet, name: str, why: str = "") -> Injected:
    assert fleet.cluster is not None
    pid = fleet.cluster.processes[name].pid
    fleet.cluster.kill(name)
    return name, [f"{name} (pid {pid}{why}) SIGKILLed"]


async def kill_worker(fleet: Fleet, phase_s: float) -> Injected:
    worker, running = busiest_worker(fleet)
    return _kill(fleet, worker, f", running {running}")


async def kill_kvstore(fleet: Fleet, phase_s: float) -> Injected:
    return _kill(fleet, "kvstore")


async def kill_gateway(fleet: Fleet, phase_s: float) -> Injected:
    return _kill(fleet, "gateway")


async def term_worker(fleet: Fleet, phase_s: float) -> Injected:
    assert fleet.cluster is not None
    worker, running = busiest_worker(fleet)
    process = fleet.cluster.processes[worker]
    signal_process(process, signal.SIGTERM)  # it drains and exits 0; the supervisor restarts it
    return worker, [f"{worker} (pid {process.pid}, running {running}) sent SIGTERM"]


async def _restart_redis(fleet: Fleet, keep_state: bool) -> Injected:
    t0 = time.monotonic()
    fleet.restart_redis(keep_state)  # here, on the main thread: it spawns redis-server
    assert fleet.redis is not None
    r = redis.Redis.from_url(fleet.redis.url, socket_timeout=2.0)
    try:
        keys = r.dbsize()
    finally:
        r.close()
    return None, [f"Redis SIGKILLed, answering again {time.monotonic() - t0:.2f} s later "
                  f"with {keys} keys"]  # fmt: skip


async def redis_lost(fleet: Fleet, phase_s: float) -> Injected:
    return await _restart_redis(fleet, keep_state=False)


async def redis_aof(fleet: Fleet, phase_s: float) -> Injected:
    return await _restart_redis(fleet, keep_state=True)


async def disk_full(fleet: Fleet, phase_s: float) -> Injected:
    """The spill file system full for half the phase, then freed."""
    if not fleet.tmpfs:
        return None, ["skipped: the spill directory is not on a tmpfs (mount refused)"]
    before = await asyncio.to_thread(_failed_writes, fleet)
    filled = await asyncio.to_thread(fleet.fill_disk)
    await asyncio.sleep(phase_s / 2)
    fleet.free_disk()
    after = await asyncio.to_thread(_failed_writes, fleet)
    held = f"{phase_s / 2:.0f} s"
    return None, [f"filled the {filled / _MIB:.0f} MiB left for {held}, then freed them; "
            f"failed spill writes: {after - before}"]  # fmt: skip


def _failed_writes(fleet: Fleet) -> int:
    assert fleet.cluster is not None
    with KVStoreClient(fleet.cluster.kvstore_target, timeout_s=5.0) as kv:
        return int(kv.usage().counters.failed_writes)


FAULTS = {
    "kill-worker": Fault("SIGKILL a worker", kill_worker),
    "kill-kvstore": Fault("SIGKILL the kvstore", kill_kvstore),
    "kill-gateway": Fault("SIGKILL the gateway", kill_gateway),
    "redis-lost": Fault("restart Redis, no persistence", redis_lost),
    "redis-aof": Fault("restart Redis, append-only file", redis_aof),
    "term-worker": Fault("SIGTERM a worker", term_worker),
    "disk-full": Fault("fill the spill disk", disk_full),
}


async def watch_back(
    fleet: Fleet, part: str, restarts: int, since: float, notes: list[str]
) -> None:
    """Note when `part` (started `restarts` times before the fault), started again by the
    supervisor, serves again: a worker once its heartbeat is back, the gateway and kvstore
    once their health check says SERVING."""
    assert fleet.supervisor is not None and fleet.cluster is not None
    try:
        while fleet.supervisor.restarts.get(part, 0) == restarts:
            await asyncio.sleep(_WATCH_S)
        while not await asyncio.to_thread(_serving, fleet, part):
            await asyncio.sleep(_WATCH_S)
    except asyncio.CancelledError:
        notes.append(f"{part} was not serving again when the run ended")
        raise
    took = time.monotonic() - since
    notes.append(f"{part} started again and serving {took:.1f} s after the fault")
    log(notes[-1])


def _serving(fleet: Fleet, part: str) -> bool:
    assert fleet.cluster is not None
    c = fleet.cluster
    if part in c.worker_ids:
        r = redis.Redis.from_url(c.redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
        try:
            return bool(r.exists(heartbeat_key(part)))
        except redis.RedisError:
            return False
        finally:
            r.close()
    probe = HealthProbe(c.target if part == "gateway" else c.kvstore_target)
    try:
        return probe.not_serving_reason() is None
    finally:
        probe.close()
