"""Placement: a request no live worker holds the KV of (a new session) goes to the least
loaded live worker, whichever worker dispatches first. DISPATCH on a real Redis with the
real WorkerBroker (heartbeats stand in for live workers), then a real two-worker cluster."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis as redis_lib

from broker import keys
from broker.gateway_broker import Bounds
from broker.messages import Job
from broker.worker_broker import Outbox, WorkerBroker
from common.enums import Priority
from common.sampling import SamplingParams
from tests.cluster_fixtures import (  # noqa: F401
    cluster_client,
    cluster_redis,
    decoded_client,
    redis_client,
    redis_server,
    sync_gateway,
)
from tests.cluster_helpers import registered_worker, wait_for
from warmfleet.client import Client
from warmfleet.launcher import Cluster
from warmfleet.redis_server import RedisServer

BIG = 10_000
ROOMS = (8, 8, 8)


def placed(r: redis_lib.Redis, worker_id: str, **status: int) -> WorkerBroker:
    """A registered worker of 8 batch slots and no idle sessions, unless `status` says."""
    return registered_worker(r, worker_id, **{"max_running": 8, "num_sessions": 0, **status})


def send(gateway: Any, rid: str, session: str, tenant: str = "t", holder: str = "") -> str:
    now = time.time()
    job = Job(rid, tenant, session, (1, 2), SamplingParams(seed=0), Priority.NORMAL, now, now + 60)
    admission = gateway.enqueue(job, Bounds(1, BIG, BIG, BIG), holder)
    return f"{admission.kind} {admission.worker_id}".strip()


def load(r: redis_lib.Redis, gateway: Any, worker_id: str, n: int) -> None:
    """n requests of a session warm on the worker: on its pinned stream."""
    r.hset(keys.session_key("t", f"held-{worker_id}"), mapping={"worker": worker_id})
    for i in range(n):
        assert send(gateway, f"{worker_id}-{i}", f"held-{worker_id}") == f"pinned {worker_id}"


def taken(broker: WorkerBroker, rooms: tuple[int, int, int] = ROOMS) -> list[str]:
    """The queued requests a worker's dispatch moves onto its stream (its own pinned
    entries, read along, are left out)."""
    got = broker.read(rooms, None)
    return [d.job.request_id for d in got if d.job and d.job.session_id.startswith("new")]


@pytest.mark.parametrize("first", ["w0", "w1"])
def test_a_new_session_goes_to_the_less_loaded_worker(
    decoded: redis_lib.Redis, gateway: Any, first: str
) -> None:
    workers = {"w0": placed(decoded, "w0"), "w1": placed(decoded, "w1")}
    load(decoded, gateway, "w0", 2)
    load(decoded, gateway, "w1", 1)
    assert send(gateway, "a", "new-a") == "queued"
    second = "w1" if first == "w0" else "w0"
    got = {first: taken(workers[first]), second: taken(workers[second])}
    assert got == {"w0": [], "w1": ["a"]}  # whoever dispatches first
    if first == "w0":  # it left the request to w1, and woke it
        assert decoded.xlen(keys.worker_wake("w1")) == 1
    # now 2 and 2: the tie goes to the smaller id; then w1 is the less loaded again
    for rid in ("b", "c"):
        assert send(gateway, rid, f"new-{rid}") == "queued"
    got = {second: taken(workers[second]), first: taken(workers[first])}
    got |= {w: got[w] + taken(workers[w]) for w in (second, first)}
    assert got == {"w0": ["b"], "w1": ["c"]}


def test_ties_go_to_the_worker_with_fewer_idle_sessions_then_the_smaller_id(
    decoded: redis_lib.Redis, gateway: Any
) -> None:
    w0, w1, w2 = placed(decoded, "w0", num_sessions=3), placed(decoded, "w1"), placed(decoded, "w2")
    for rid in ("a", "b", "c"):
        send(gateway, rid, f"new-{rid}")
    # all idle: w1 and w2 hold fewer sessions than w0, and w1 < w2
    assert (taken(w0), taken(w2), taken(w1)) == ([], [], ["a"])
    assert (taken(w0), taken(w1), taken(w2)) == ([], [], ["b"])
    assert (taken(w1), taken(w2), taken(w0)) == ([], [], ["c"])  # 1, 1, 0 running


def test_only_a_live_worker_with_a_free_slot_is_waited_for(
    decoded: redis_lib.Redis, gateway: Any
) -> None:
    w0 = placed(decoded, "w0")
    load(decoded, gateway, "w0", 3)
    placed(decoded, "full", max_running=2)
    load(decoded, gateway, "full", 2)  # less loaded, but no free slot
    placed(decoded, "drains").set_draining()
    placed(decoded, "dead")
    decoded.delete(keys.heartbeat_key("dead"))
    adopter = placed(decoded, "adopter", num_adopted=4)  # runs a dead worker's requests
    assert send(gateway, "a", "new-a") == "queued"
    assert taken(adopter) == []  # 4 running: w0, with 3, goes first
    assert decoded.xlen(keys.worker_wake("w0")) == 1
    assert taken(w0) == ["a"]
    for other in ("full", "drains", "dead", "adopter"):
        assert decoded.xlen(keys.worker_wake(other)) == 0  # none was waited for


def test_requests_leave_the_queues_in_fair_order_spread_over_the_workers(
    decoded: redis_lib.Redis, gateway: Any
) -> None:
    w0, w1 = placed(decoded, "w0"), placed(decoded, "w1")
    for i in range(6):
        send(gateway, f"flood-{i}", f"new-f{i}", tenant="flooder")
    for i in range(2):
        send(gateway, f"quiet-{i}", f"new-q{i}", tenant="quiet")
    order, by_worker = [], Counter[str]()
    for w in itertools.islice(itertools.cycle([w0, w1]), 12):
        got = taken(w)
        order += got
        by_worker[w.worker_id] += len(got)
    # one at a time each (the other is then less loaded), in the order one worker sees
    assert order == ["flood-0", "quiet-0", "flood-1", "quiet-1"] + [
        f"flood-{i}" for i in range(2, 6)
    ]
    assert by_worker == {"w0": 4, "w1": 4}


def test_a_new_session_goes_to_its_prefix_s_holder_while_it_has_room(
    decoded: redis_lib.Redis, gateway: Any
) -> None:
    """The holder (the worker holding the session that last sent the prompt's prefix) takes
    it while it has a free slot and runs at most PREFIX_SLACK more than the least loaded."""
    placed(decoded, "w0")
    placed(decoded, "w1", max_running=3)
    load(decoded, gateway, "w1", 1)  # w1 holds "held-w1" and runs one request of it
    assert send(gateway, "a", "new-a", holder="held-w1") == "pinned w1"  # 2 against 0
    assert send(gateway, "b", "new-b", holder="held-w1") == "pinned w1"  # 3: its last slot
    assert send(gateway, "c", "new-c", holder="held-w1") == "queued"  # full
    placed(decoded, "w1", max_running=8)  # room again, but 3 running against none
    assert send(gateway, "d", "new-d", holder="held-w1") == "queued"  # 3 > 0 + 2
    assert send(gateway, "e", "new-e", holder="gone") == "queued"  # held nowhere
    decoded.delete(keys.session_key("t", "held-w1"))
    assert send(gateway, "f", "new-f", holder="held-w1") == "queued"


def test_a_worker_that_ends_its_requests_takes_the_next_one(
    decoded: redis_lib.Redis, gateway: Any
) -> None:
    w0, w1 = placed(decoded, "w0"), placed(decoded, "w1")
    for rid in ("a", "b", "c"):
        send(gateway, rid, f"new-{rid}")
    first = w0.read(ROOMS, None)
    assert [d.job.request_id for d in first if d.job] == ["a"]
    assert taken(w1) == ["b"]
    w0.publish(Outbox(acks=first), [])  # a ends: w0 runs nothing, w1 one
    assert taken(w1) == []
    assert taken(w0) == ["c"]


def test_an_idle_worker_wakes_when_another_leaves_it_a_request(
    decoded: redis_lib.Redis,
    gateway: Any,
    redis_server: RedisServer,  # noqa: F811
) -> None:
    clients = [redis_lib.Redis.from_url(redis_server.url, decode_responses=True) for _ in "ab"]
    w0, w1 = WorkerBroker(clients[0], "w0", 5.0), WorkerBroker(clients[1], "w1", 5.0)
    for w in (w0, w1):
        w.register({"max_running": 8}, ttl_s=60)
    load(decoded, gateway, "w0", 1)
    assert [d.job.request_id for d in w0.read(ROOMS, None) if d.job] == ["w0-0"]
    got: dict[str, list[str]] = {}

    def block(w: WorkerBroker) -> None:  # idle: waits on its streams
        got[w.worker_id] = [d.job.request_id for d in w.read(ROOMS, 60_000) if d.job]

    threads = {w.worker_id: threading.Thread(target=block, args=(w,)) for w in (w0, w1)}
    threads["w0"].start()  # w0 blocks first: the queue's wake goes to it
    wait_for(lambda: blocked(decoded) == 1, "w0 to block")
    threads["w1"].start()
    wait_for(lambda: blocked(decoded) == 2, "w1 to block")
    assert send(gateway, "a", "new-a") == "queued"
    for t in threads.values():
        t.join(timeout=30)  # far below the 60 s wait: each was woken
        assert not t.is_alive()
    assert got == {"w0": [], "w1": ["a"]}
    for c in clients:
        c.close()


def blocked(r: redis_lib.Redis) -> int:
    return sum(1 for c in r.client_list() if c["cmd"] == "xreadgroup" and "b" in c["flags"])


@pytest.fixture(scope="module")
def cluster(default_cluster: Cluster) -> Cluster:
    return default_cluster


def four_new_sessions_at_once(client: Client, round_: int) -> list[str]:
    """The workers that ran them. Each reply is 48 tokens (about a second here), so every
    request is still on its worker's stream while the others are placed, however the
    machine delays their sending: with 4 tokens (and an EOS) a busy machine let a first
    reply end before the fourth request was placed, which then went where it had ended."""
    barrier = threading.Barrier(4)
    placed: list[str] = []

    def talk(i: int) -> None:
        messages = [{"role": "user", "content": f"Name an animal with {i + 2} legs."}]
        barrier.wait(timeout=60)
        reply = client.complete(
            f"placement-{round_}-{i}", messages=messages, max_tokens=48, ignore_eos=True
        )
        placed.append(reply.completion.worker_id)

    threads = [threading.Thread(target=talk, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return placed


@pytest.mark.slow
def test_new_sessions_sent_at_once_are_spread_evenly(
    cluster: Cluster, client: Client, r: redis_lib.Redis
) -> None:
    workers = cluster.worker_ids
    assert len(workers) == 2
    for round_ in range(5):
        wait_for(lambda: all(r.exists(keys.heartbeat_key(w)) for w in workers), "both live")
        wait_for(lambda: not any(r.xlen(keys.pinned_stream(w)) for w in workers), "both idle")
        placed = four_new_sessions_at_once(client, round_)
        assert sorted(Counter(placed).items()) == [(w, 2) for w in sorted(workers)], round_
