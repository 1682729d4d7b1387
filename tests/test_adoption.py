"""Taking over a dead worker's requests, on a real Redis: they are adopted as soon as its
heartbeat is gone (the leases here are far too long to explain it), each by one live worker
(an entry a live worker adopted stays with it, and the adoption lock is released), and none
while the adopter's own heartbeat is missing too (Redis stalled, not the others)."""

from __future__ import annotations

import json
import time

import pytest
import redis as redis_lib

from broker import codec, keys
from broker.messages import Job
from broker.worker_broker import Outbox
from common.enums import Priority
from common.sampling import SamplingParams
from tests.cluster_fixtures import decoded_client, redis_client, redis_server  # noqa: F401
from tests.cluster_helpers import registered_worker, wait_for
from worker.liveness import Liveness

LEASE_S = 600.0  # no lease lapses during a test: only heartbeats decide


@pytest.fixture
def r(decoded: redis_lib.Redis) -> redis_lib.Redis:
    return decoded


def pin(r: redis_lib.Redis, worker_id: str, *request_ids: str) -> None:
    now = time.time()
    for rid in request_ids:
        job = Job(rid, "t", "", (1, 2), SamplingParams(seed=0), Priority.NORMAL, now, now + 60)
        r.xadd(keys.pinned_stream(worker_id), codec.fields(job))


def owners(r: redis_lib.Redis, worker_id: str) -> dict[str, int]:
    """Pending entries of a worker's pinned stream, counted by the consumer holding them."""
    pending = r.xpending(keys.pinned_stream(worker_id), keys.GROUP)
    return {c["name"]: int(c["pending"]) for c in pending["consumers"]}


def die(r: redis_lib.Redis, worker_id: str) -> None:
    """As the launcher does when it sees the process exit: its heartbeat goes at once."""
    r.delete(keys.heartbeat_key(worker_id))


def test_a_dead_workers_stream_is_adopted_once_and_again_if_its_adopter_dies(
    r: redis_lib.Redis,
) -> None:
    w0, w1, w2 = (registered_worker(r, w, LEASE_S) for w in ("w0", "w1", "w2"))
    pin(r, "w0", "a", "b", "c")
    assert [d.job.request_id for d in w0.read_pinned(3) if d.job] == ["a", "b", "c"]
    pin(r, "w0", "d")  # not read yet
    assert w1.reclaim(10) == [] and w2.reclaim(10) == []  # w0 lives

    die(r, "w0")
    taken = w1.reclaim(10)
    assert sorted(d.job.request_id for d in taken if d.job) == ["a", "b", "c", "d"]
    assert owners(r, "w0") == {"w1": 4}
    assert not r.exists(keys.adopt_lock("w0"))  # released: the next death is seen at once
    assert w2.reclaim(10) == [] and w1.reclaim(10) == []  # w1 runs them: nobody takes them
    assert owners(r, "w0") == {"w1": 4}

    die(r, "w1")  # the adopter dies too: its entries on w0's stream are orphans now
    again = w2.reclaim(10)
    assert sorted(d.job.request_id for d in again if d.job) == ["a", "b", "c", "d"]
    assert owners(r, "w0") == {"w2": 4}
    assert r.smembers(keys.WORKERS) == {"w0", "w2"}  # w1's empty stream is retired
    w2.publish(Outbox(acks=again), [])
    assert w2.reclaim(10) == []
    assert r.smembers(keys.WORKERS) == {"w2"}  # and w0's, once its requests ended
    assert not r.exists(keys.pinned_stream("w0"), keys.pinned_stream("w1"))


def test_nothing_is_adopted_while_the_adopters_own_heartbeat_is_missing(
    r: redis_lib.Redis,
) -> None:
    w0, w1 = registered_worker(r, "w0", LEASE_S), registered_worker(r, "w1", LEASE_S)
    pin(r, "w0", "a")
    w0.read_pinned(1)
    die(r, "w0")
    die(r, "w1")  # every heartbeat lapsed at once: Redis stalled rather than w0 died
    assert w1.reclaim(10) == []
    w1.register({"warm_budget": 0}, ttl_s=60)
    assert [d.job.request_id for d in w1.reclaim(10) if d.job] == ["a"]


def test_the_liveness_thread_writes_the_heartbeat_with_its_own_short_ttl(
    r: redis_lib.Redis,
) -> None:
    broker = registered_worker(r, "w0", LEASE_S)
    liveness = Liveness(broker, lease_s=LEASE_S, interval_s=0.1, stall_s=LEASE_S,
                        heartbeat_ttl_s=0.5)  # fmt: skip
    liveness.start(json.dumps({"pid": 1}))
    try:
        wait_for(lambda: 0 < r.pttl(keys.heartbeat_key("w0")) <= 500, "a beat with the TTL")
    finally:
        liveness.stop()
    wait_for(lambda: not r.exists(keys.heartbeat_key("w0")), "the heartbeat to lapse")


def test_a_request_that_ends_on_two_workers_leaves_the_running_count_once(
    r: redis_lib.Redis,
) -> None:
    """w0 was taken for dead but was only slow: it and its adopter both end request a."""
    w0, w1 = registered_worker(r, "w0", LEASE_S), registered_worker(r, "w1", LEASE_S)
    pin(r, "w0", "a", "b")
    r.hset(keys.RUNNING, "t", 2)  # as DISPATCH counts them
    mine = w0.read_pinned(2)
    die(r, "w0")
    adopted = w1.reclaim(10)
    assert sorted(d.job.request_id for d in adopted if d.job) == ["a", "b"]
    w1.publish(Outbox(acks=[d for d in adopted if d.job and d.job.request_id == "a"]), [])
    w0.publish(Outbox(acks=[d for d in mine if d.job and d.job.request_id == "a"]), [])
    assert r.hget(keys.RUNNING, "t") == "1"  # b still runs
    assert r.xlen(keys.pinned_stream("w0")) == 1


def test_a_worker_that_came_back_is_not_retired_and_a_dead_ones_streams_go(
    r: redis_lib.Redis,
) -> None:
    """The retirement decided while w0 was dead finds it back (a restart registers at once):
    its new streams and membership stay. Dead for good, its pinned and wake streams go."""
    w0, w1 = registered_worker(r, "w0", LEASE_S), registered_worker(r, "w1", LEASE_S)
    die(r, "w0")
    w0.register({"warm_budget": 0}, ttl_s=60)  # back before w1 acts on what it saw
    w1._retire_if_dead("w0")
    assert "w0" in r.smembers(keys.WORKERS)
    assert r.exists(keys.pinned_stream("w0"), keys.worker_wake("w0")) == 2
    die(r, "w0")
    assert w1.reclaim(10) == []
    assert r.smembers(keys.WORKERS) == {"w1"}
    assert not r.exists(keys.pinned_stream("w0"), keys.worker_wake("w0"))
