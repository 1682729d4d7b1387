"""A tenant's running bound (max_concurrent) holds for requests of sessions warm on a worker
too: such a request waits in its tenant's queue, marked with that worker, and that worker
takes it when the tenant's turn comes while it has a free slot; else placement decides.
ENQUEUE and DISPATCH on a real Redis with the real WorkerBroker (heartbeats stand in for
live workers)."""

from __future__ import annotations

import time
from typing import Any

import redis as redis_lib

from broker import keys
from broker.gateway_broker import Bounds
from broker.leases import Delivery
from broker.messages import Job
from broker.worker_broker import Outbox, WorkerBroker
from common.enums import Priority
from common.sampling import SamplingParams
from tests.cluster_fixtures import (  # noqa: F401
    decoded_client,
    redis_client,
    redis_server,
    sync_gateway,
)
from tests.cluster_helpers import registered_worker

BIG = 10_000
ROOMS = (8, 8, 8)


def warm(r: redis_lib.Redis, tenant: str, session: str, worker_id: str) -> None:
    """The index says the session is warm on the worker."""
    r.hset(keys.session_key(tenant, session), mapping={"worker": worker_id})


def send(gateway: Any, rid: str, session: str, tenant: str = "t", running: int = 1) -> str:
    now = time.time()
    job = Job(rid, tenant, session, (1, 2), SamplingParams(seed=0), Priority.NORMAL, now, now + 60)
    admission = gateway.enqueue(job, Bounds(1, BIG, BIG, running))
    return f"{admission.kind} {admission.worker_id}".strip()


def read(worker: WorkerBroker) -> list[Delivery]:
    """What the worker's next pass reads: its pinned stream, after its dispatch."""
    return [d for d in worker.read(ROOMS, None) if d.job]


def ids(deliveries: list[Delivery]) -> list[str]:
    return [d.job.request_id for d in deliveries if d.job]


def test_a_warm_session_waits_for_its_tenant_then_goes_to_the_worker_holding_it(
    decoded: redis_lib.Redis, gateway: Any
) -> None:
    w0 = registered_worker(decoded, "w0", max_running=8, num_sessions=2)
    w1 = registered_worker(decoded, "w1", max_running=8, num_sessions=0)
    warm(decoded, "t", "s1", "w0")
    warm(decoded, "t", "s2", "w0")
    assert send(gateway, "a", "s1") == "pinned w0"
    assert send(gateway, "b", "s2") == "queued"  # the tenant runs its one request
    assert decoded.hget(keys.queued_request("b"), "h") == "w0"
    assert decoded.hget(keys.RUNNING, "t") == "1"
    assert ids(read(w1)) == []  # the tenant is at its bound
    running = read(w0)
    assert ids(running) == ["a"]
    w0.publish(Outbox(acks=running), [])  # a ends
    assert ids(read(w1)) == []  # less loaded, but b's session is warm on w0
    assert decoded.xlen(keys.worker_wake("w0")) == 1  # w0 is woken for it
    assert ids(read(w0)) == ["b"]
    assert decoded.hget(keys.RUNNING, "t") == "1"
    assert send(gateway, "c", "s1", running=2) == "pinned w0"  # under a larger bound


def test_when_the_holder_has_no_free_slot_placement_decides(
    decoded: redis_lib.Redis, gateway: Any
) -> None:
    w0 = registered_worker(decoded, "w0", max_running=2, num_sessions=3)
    w1 = registered_worker(decoded, "w1", max_running=2, num_sessions=0)
    for tenant, session in (("t", "s1"), ("t", "s2"), ("o", "o1")):
        warm(decoded, tenant, session, "w0")
    assert send(gateway, "a", "s1") == "pinned w0"
    assert send(gateway, "b", "s2") == "queued"
    assert send(gateway, "o1", "o1", tenant="o", running=BIG) == "pinned w0"
    running = read(w0)
    w0.publish(Outbox(acks=[d for d in running if d.job and d.job.request_id == "a"]), [])
    assert send(gateway, "o2", "o1", tenant="o", running=BIG) == "pinned w0"  # w0 full again
    assert ids(read(w1)) == ["b"]  # recomputed there rather than waiting for a slot on w0
    assert decoded.xlen(keys.worker_wake("w0")) == 0
