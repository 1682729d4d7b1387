"""Routing on a real Redis: a session goes to the worker the index names, else to the one
that last started it; a draining worker is routed nothing and hands what waits on its stream
to the live worker placement ranks first; the worker's liveness thread keeps its
heartbeat, notices a lost registration, and stops when the loop stalls."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis as redis_lib

from broker import keys
from broker.gateway_broker import Bounds
from broker.messages import EventKind, Job, SessionEvent
from broker.worker_broker import Outbox
from common.enums import Priority
from common.sampling import SamplingParams
from tests.cluster_fixtures import (  # noqa: F401
    decoded_client,
    redis_client,
    redis_server,
    sync_gateway,
)
from tests.cluster_helpers import registered_worker, wait_for
from worker.liveness import Liveness

BIG = 10_000


@pytest.fixture
def r(decoded: redis_lib.Redis) -> redis_lib.Redis:
    return decoded


def send(gateway: Any, rid: str, session: str = "s") -> tuple[str, str]:
    now = time.time()
    job = Job(rid, "t", session, (1, 2), SamplingParams(seed=0), Priority.NORMAL, now, now + 60)
    admission = gateway.enqueue(job, Bounds(1, BIG, BIG, BIG))
    return admission.kind, admission.worker_id


def test_the_index_wins_then_the_affinity_then_the_queue(r: redis_lib.Redis, gateway: Any) -> None:
    w0, w1 = registered_worker(r, "w0"), registered_worker(r, "w1")
    assert send(gateway, "a") == ("queued", "")  # a new session: any worker
    # w1 starts it: its session event also leaves the affinity, before the kvstore acts
    w1.publish(Outbox(events=[SessionEvent(EventKind.HOT, "w1", keys.cache_key("t", "s"))]), [])
    assert r.get(keys.affinity_key("t", "s")) == "w1"
    assert send(gateway, "b") == ("pinned", "w1")
    r.hset(keys.session_key("t", "s"), mapping={"worker": "w0", "tier": "warm"})
    assert send(gateway, "c") == ("pinned", "w0")  # the index, once it names a live worker
    w0.set_draining()
    assert send(gateway, "d") == ("pinned", "w1")  # not to a draining worker
    assert gateway.live_workers() == ["w1"]
    w1.set_draining()
    assert send(gateway, "e") == ("no_worker", "")
    assert gateway.live_workers() == []


def test_a_draining_worker_hands_waiting_requests_to_the_shortest_stream(
    r: redis_lib.Redis, gateway: Any
) -> None:
    w0, w1, w2 = registered_worker(r, "w0"), registered_worker(r, "w1"), registered_worker(r, "w2")
    r.hset(keys.session_key("t", "s"), mapping={"worker": "w0", "tier": "warm"})
    for rid in ("x", "y", "z"):
        assert send(gateway, rid) == ("pinned", "w0")
    r.hset(keys.session_key("t", "s"), mapping={"worker": "w1"})
    assert send(gateway, "on-w1") == ("pinned", "w1")  # w1's stream is now the longer
    w0.set_draining()
    waiting = w0.read_pinned(10)
    assert [d.job.request_id for d in waiting if d.job] == ["x", "y", "z"]
    # streams of 1 and 0 entries; then 1 and 1 (the smaller id wins); then 2 and 1
    assert [w0.hand_over(d) for d in waiting] == ["w2", "w1", "w2"]
    assert r.xlen(keys.pinned_stream("w0")) == 0
    assert r.xpending(keys.pinned_stream("w0"), keys.GROUP)["pending"] == 0
    moved = [d.job.request_id for d in w2.read_pinned(10) if d.job]
    assert moved == ["x", "z"]
    w1.set_draining()
    w2.set_draining()
    left = w1.read_pinned(10)
    assert [d.job.request_id for d in left if d.job] == ["on-w1", "y"]
    assert [w1.hand_over(d) for d in left] == ["", ""]  # no live worker: they stay there
    assert r.xlen(keys.pinned_stream("w1")) == 2


def test_the_hand_over_follows_placements_ranking(r: redis_lib.Redis, gateway: Any) -> None:
    """Load counts the requests a worker runs from a dead worker's stream, idle sessions
    break ties, and a worker with a free slot comes before a full one."""
    w0, _, _, _ = (registered_worker(r, w) for w in ("w0", "w1", "w2", "w3"))
    for w, held in (("w2", "w2"), ("w3", "w3")):
        r.hset(keys.session_key("t", held), mapping={"worker": w, "tier": "warm"})
        assert send(gateway, f"on-{w}", held) == ("pinned", w)
    r.hset(keys.session_key("t", "s"), mapping={"worker": "w0", "tier": "warm"})
    for rid in ("x", "y", "z", "late"):
        assert send(gateway, rid) == ("pinned", "w0")
    status = {  # loads: w1 2 (adopted), w2 1 with 5 idle sessions, w3 1 and full
        "w1": {"num_adopted": 2, "num_sessions": 0, "max_running": 8},
        "w2": {"num_sessions": 5, "max_running": 8},
        "w3": {"num_sessions": 0, "max_running": 1},
    }
    for w, s in status.items():
        r.set(keys.heartbeat_key(w), json.dumps(s), ex=60)
    w0.set_draining()
    waiting = w0.read_pinned(10)
    # the shortest stream (w1's, empty) would take the first; then w2 and w1 at 2 each
    # (w1 has fewer idle sessions); then w2 at 2 and w1 at 3
    assert [w0.hand_over(d) for d in waiting[:3]] == ["w2", "w1", "w2"]
    r.set(keys.heartbeat_key("w1"), json.dumps({**status["w1"], "max_running": 3}), ex=60)
    r.set(keys.heartbeat_key("w2"), json.dumps({**status["w2"], "max_running": 3}), ex=60)
    assert w0.hand_over(waiting[3]) == "w3"  # every one full: the least loaded of all


def test_liveness_beats_rejoins_and_stops_when_the_loop_stalls(r: redis_lib.Redis) -> None:
    broker = registered_worker(r, "w0")
    liveness = Liveness(broker, lease_s=1.0, interval_s=0.1, stall_s=1.5, heartbeat_ttl_s=1.0)
    liveness.start(json.dumps({"pid": 1}))
    try:
        assert not liveness.kvstore_alive
        r.set(keys.KVSTORE_HEARTBEAT, "1", ex=10)
        wait_for(lambda: liveness.kvstore_alive, "the kvstore to be seen")
        r.srem(keys.WORKERS, "w0")  # as when Redis restarts empty
        wait_for(liveness.lost.is_set, "the lost registration to be noticed")
        assert r.sismember(keys.WORKERS, "w0")
        for _ in range(20):  # the loop makes progress: the heartbeat stays
            liveness.update(json.dumps({"pid": 2}), [])
            time.sleep(0.1)
        assert json.loads(r.get(keys.heartbeat_key("w0")) or "{}") == {"pid": 2}
        # the loop stalls: beats stop, and the heartbeat expires with its TTL
        wait_for(lambda: not r.exists(keys.heartbeat_key("w0")), "the heartbeat to lapse")
    finally:
        liveness.stop()
