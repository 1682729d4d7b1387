"""The fair queue's Lua scripts on a real Redis: strict classes, weighted fair share between
tenants, bounds, removal. A registered worker heartbeat stands in for a live worker; the
worker's side is the real WorkerBroker."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
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


@pytest.fixture
def client(decoded: redis_lib.Redis) -> redis_lib.Redis:
    return decoded


@pytest.fixture
def worker(client: redis_lib.Redis) -> WorkerBroker:
    return registered_worker(client, "w0")


def request(rid: str, tenant: str, priority: str = "normal", tokens: int = 10) -> Job:
    now = time.time()
    sampling = SamplingParams(max_tokens=1, seed=0)
    ids = tuple(range(tokens - 1))  # costs prompt + max_tokens = `tokens`
    return Job(rid, tenant, "", ids, sampling, Priority(priority), now, now + 60)


def put(
    gateway: Any, rid: str, tenant: str, *, weight: int = 1, max_queued: int = BIG,
    max_total: int = BIG, priority: str = "normal", tokens: int = 10, max_running: int = BIG,
) -> str:  # fmt: skip
    job = request(rid, tenant, priority, tokens)
    return gateway.enqueue(job, Bounds(weight, max_queued, max_total, max_running)).kind


def take(worker: WorkerBroker, n: int = 1) -> list[str]:
    """Request ids the worker dispatches, one at a time, in order."""
    out = []
    for _ in range(n):
        got = worker.read((1, 1, 1), None)
        out += [d.job.request_id for d in got if d.job is not None]
    return out


def test_a_flooding_tenant_does_not_starve_a_quiet_one(gateway: Any, worker: WorkerBroker) -> None:
    for i in range(40):
        assert put(gateway, f"flood-{i}", "flooder") == "queued"
    order = take(worker, 3)  # the flooder alone for a while
    for i in range(5):
        assert put(gateway, f"quiet-{i}", "quiet") == "queued"
    order += take(worker, 42)
    assert len(order) == 45 and len(set(order)) == 45
    positions = [order.index(f"quiet-{i}") for i in range(5)]
    # equal weights, equal costs: they alternate while both have work
    assert positions == [3, 5, 7, 9, 11], order[:14]
    flood = [r for r in order if r.startswith("flood")]
    assert flood == [f"flood-{i}" for i in range(40)]  # each tenant's own order is kept


def test_weights_share_tokens_in_proportion(gateway: Any, worker: WorkerBroker) -> None:
    for i in range(60):
        put(gateway, f"heavy-{i}", "heavy", weight=3, tokens=10)
        put(gateway, f"light-{i}", "light", weight=1, tokens=10)
    window = take(worker, 40)  # both still have work throughout
    share = Counter(r.split("-")[0] for r in window)
    assert share["heavy"] == 30 and share["light"] == 10


def test_costs_count_tokens_not_requests(gateway: Any, worker: WorkerBroker) -> None:
    for i in range(20):
        put(gateway, f"big-{i}", "big", tokens=100)
        put(gateway, f"small-{i}", "small", tokens=10)
    window = take(worker, 22)
    tokens: Counter[str] = Counter()
    for rid in window:
        tokens[rid.split("-")[0]] += 100 if rid.startswith("big") else 10
    assert abs(tokens["big"] - tokens["small"]) <= 100  # within one request's cost


def test_classes_are_served_strictly_in_order(gateway: Any, worker: WorkerBroker) -> None:
    put(gateway, "b1", "t", priority="batch")
    put(gateway, "n1", "t", priority="normal")
    put(gateway, "i1", "u", priority="interactive")
    put(gateway, "n2", "u", priority="normal")
    assert take(worker, 4) == ["i1", "n1", "n2", "b1"]


def test_bounds_refuse_at_once_and_removal_frees_the_place(
    gateway: Any, worker: WorkerBroker, redis: redis_lib.Redis
) -> None:
    assert put(gateway, "a1", "a", max_queued=2) == "queued"
    assert put(gateway, "a2", "a", max_queued=2) == "queued"
    refused = gateway.enqueue(request("a3", "a"), Bounds(1, 2, BIG, BIG))
    assert (refused.kind, refused.queued) == ("tenant_full", 2)
    assert put(gateway, "b1", "b", max_total=3) == "queued"
    assert put(gateway, "b2", "b", max_total=3) == "full"
    assert gateway.unqueue(request("a1", "a")) is True
    assert gateway.unqueue(request("a1", "a")) is False  # gone already
    assert not redis.exists(keys.queued_request("a1"))
    assert put(gateway, "a3", "a", max_queued=2) == "queued"
    assert take(worker, 4) == ["a2", "b1", "a3"]
    assert int(redis.get(keys.QUEUED)) == 0 and int(redis.get(keys.tenant_queued("a"))) == 0
    assert redis.zcard(keys.fair_active("normal")) == 0
    assert gateway.unqueue(request("a2", "a")) is False  # a worker has it


def test_a_request_whose_deadline_passed_in_the_queue_is_skipped(
    gateway: Any, worker: WorkerBroker, redis: redis_lib.Redis
) -> None:
    put(gateway, "old", "a")
    put(gateway, "new", "a")
    redis.delete(keys.queued_request("old"))  # as its expiry (the deadline) does
    assert take(worker, 1) == ["new"]
    assert int(redis.get(keys.QUEUED)) == 0


def test_nothing_queued_without_a_live_worker(gateway: Any, redis: redis_lib.Redis) -> None:
    redis.sadd(keys.WORKERS, "w9")  # registered, but its heartbeat is gone
    assert put(gateway, "r", "a") == "no_worker"
    assert not redis.exists(keys.fair_queue("normal", "a"))


def test_the_dispatched_job_is_the_one_enqueued(
    gateway: Any, worker: WorkerBroker, client: redis_lib.Redis
) -> None:
    job = request("r1", "a", tokens=7)
    gateway.enqueue(job, Bounds(1, BIG, BIG, BIG))
    (delivery,) = worker.read((1, 1, 1), None)
    assert delivery.stream == keys.pinned_stream("w0")
    assert delivery.job == job
    assert not client.exists(keys.queued_request("r1"))  # moved, not copied
    assert client.llen(keys.fair_queue("normal", "a")) == 0


def test_room_by_class_lets_interactive_requests_in_first(
    gateway: Any, worker: WorkerBroker
) -> None:
    put(gateway, "n1", "t", priority="normal")
    put(gateway, "i1", "t", priority="interactive")
    put(gateway, "i2", "u", priority="interactive")
    # a full worker running a batch request: room for one interactive request only
    got = [d.job.request_id for d in worker.read((1, 0, 0), None) if d.job]
    assert got == ["i1"]
    got = [d.job.request_id for d in worker.read((2, 2, 2), None) if d.job]
    assert got == ["i2", "n1"]


def test_a_tenant_at_its_running_bound_waits_and_others_go(
    gateway: Any, worker: WorkerBroker, client: redis_lib.Redis
) -> None:
    put(gateway, "a1", "a", max_running=1)
    put(gateway, "a2", "a", max_running=1)
    put(gateway, "b1", "b", max_running=1)
    first = worker.read((5, 5, 5), None)
    assert [d.job.request_id for d in first if d.job] == ["a1", "b1"]
    assert client.hgetall(keys.RUNNING) == {"a": "1", "b": "1"}
    assert worker.read((5, 5, 5), None) == []  # a2 waits for a1
    worker.publish(Outbox(acks=[first[0]]), [])  # a1 ends
    assert client.hget(keys.RUNNING, "a") == "0"
    assert [d.job.request_id for d in worker.read((5, 5, 5), None) if d.job] == ["a2"]


def test_what_a_request_did_not_use_is_given_back(
    gateway: Any, worker: WorkerBroker, client: redis_lib.Redis
) -> None:
    """Both tenants ask 100 tokens a request; "early" replies stop after 10 in all. Charged
    what they asked, they alternate; given back the 90 unused when each ends, "early" runs
    ten requests for each of "exact"'s."""
    for i in range(30):
        put(gateway, f"early-{i}", "early", tokens=100)
        put(gateway, f"exact-{i}", "exact", tokens=100)
    order = []
    for _ in range(22):
        (d,) = worker.read((1, 1, 1), None)
        assert d.job is not None
        rid = d.job.request_id
        order.append(rid.split("-")[0])
        used = 10 if rid.startswith("early") else 100
        worker.publish(Outbox(acks=[d], used_tokens={rid: used}), [])
        assert not client.exists(keys.fair_charge(rid))  # given back once, then gone
    assert 19 <= order.count("early") <= 21, order


def test_a_request_that_ran_nothing_is_given_all_back(
    gateway: Any, worker: WorkerBroker, client: redis_lib.Redis
) -> None:
    """Refused by the worker before it ran (not in used_tokens): charged nothing in the end,
    and a request that came pinned (never charged) leaves the virtual times alone."""
    state = keys.fair_state("normal")
    put(gateway, "r1", "solo", tokens=100)
    (d,) = worker.read((1, 1, 1), None)
    assert float(client.hget(state, "solo")) - float(client.hget(state, "~clock")) == 100
    worker.publish(Outbox(acks=[d]), [])
    assert float(client.hget(state, "solo")) == float(client.hget(state, "~clock"))
    assert not client.exists(keys.fair_charge("r1"))
    before = client.hgetall(state)
    stream = keys.pinned_stream("w0")  # an entry no queue charged, as a pinned request's
    entry = client.xadd(stream, {"x": "y"})
    client.xreadgroup(keys.GROUP, "w0", {stream: ">"})
    assert d.job is not None
    pinned = Delivery(stream, entry, replace(d.job, request_id="pinned-1"))
    worker.publish(Outbox(acks=[pinned], used_tokens={"pinned-1": 3}), [])
    assert client.hgetall(state) == before and client.xlen(stream) == 0
