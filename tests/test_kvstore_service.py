"""The kvstore's loop on a real Redis, without workers (their heartbeats and events written
by the test): what it does with commands it cannot read, with a worker it has not seen yet,
and with one whose heartbeat lapsed and came back."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import redis as redis_lib

from broker import codec, keys
from broker.messages import (
    AnswerStatus,
    CommandAnswer,
    CommandOp,
    ControlOrder,
    EventKind,
    Held,
    KVCommand,
    OrderOp,
    SessionEvent,
)
from kvstore.service import KVStore
from tests.cluster_fixtures import decoded_client, redis_client, redis_server  # noqa: F401
from tests.cluster_helpers import wait_for


def test_an_unreadable_command_is_answered_with_an_error(
    decoded: redis_lib.Redis, tmp_path: Path
) -> None:
    store = KVStore(decoded, tmp_path / "spill", disk_budget=None, block_ms=10)
    store.start()
    reply_to = keys.reply_key("t1")
    unknown = {"k": "command", "v": 1, "op": "rename", "key": "local/s", "reply_to": reply_to}
    decoded.xadd(keys.KV_EVENTS, {codec.FIELD: json.dumps(unknown)})
    decoded.xadd(keys.KV_EVENTS, {codec.FIELD: "not json"})  # no reply key: only dropped
    assert store.step() == 2
    (raw,) = decoded.lrange(reply_to, 0, -1)
    answer = codec.decode(raw, CommandAnswer)
    assert answer.status == AnswerStatus.ERROR and "rename" in answer.message
    assert decoded.xlen(keys.KV_EVENTS) == 0  # both acknowledged and deleted


def test_a_worker_that_started_after_the_last_look_gets_its_delete_order(
    decoded: redis_lib.Redis, tmp_path: Path
) -> None:
    """Its sessions' events name a worker the kvstore has not seen yet (it reads the
    heartbeats twice a second): the kvstore looks again before acting, so a delete reaches
    the worker's memory instead of being answered as if the worker were dead."""
    store = KVStore(decoded, tmp_path / "spill", disk_budget=None, block_ms=10)
    store.start()
    store.step(block=False)  # its look at the workers: none yet
    decoded.sadd(keys.WORKERS, "w9")
    decoded.set(keys.heartbeat_key("w9"), json.dumps({"warm_budget": 1 << 20, "pid": 9}))
    warm = SessionEvent(EventKind.WARM, "w9", "local/s1", 20, 4096, time.time())
    decoded.xadd(keys.KV_EVENTS, codec.fields(warm))
    reply_to = keys.reply_key("t2")
    delete = KVCommand(CommandOp.DELETE, "local/s1", reply_to, deadline=time.time() + 30)
    decoded.xadd(keys.KV_EVENTS, codec.fields(delete))
    assert store.step(block=False) == 2
    entries = decoded.xrange(keys.pinned_stream("w9"))
    report, drop = [codec.decode(f[codec.FIELD], ControlOrder) for _, f in entries]
    assert report.op == OrderOp.REPORT  # a worker this index never saw may hold sessions
    assert (drop.op, drop.key, drop.reply_to) == (OrderOp.DROP, "local/s1", reply_to)
    assert decoded.llen(reply_to) == 0  # the worker's event answers it, once it has dropped


def beat(r: redis_lib.Redis, worker: str, pid: int = 100) -> None:
    r.sadd(keys.WORKERS, worker)
    r.set(keys.heartbeat_key(worker), json.dumps({"warm_budget": 1 << 20, "pid": pid}))


def orders(r: redis_lib.Redis, worker: str) -> list[OrderOp]:
    entries = r.xrange(keys.pinned_stream(worker))
    return [codec.decode(f[codec.FIELD], ControlOrder).op for _, f in entries]


def test_a_worker_whose_heartbeat_comes_back_is_asked_what_it_holds(
    decoded: redis_lib.Redis, tmp_path: Path
) -> None:
    """Its heartbeat lapsed (Redis restarted with its state after longer than the TTL, say):
    its sessions were taken for lost. Back, it is ordered to report, and its inventory
    puts them back on it."""
    beat(decoded, "w1")
    store = KVStore(decoded, tmp_path / "spill", disk_budget=None, block_ms=10)
    store.start()
    assert orders(decoded, "w1") == [OrderOp.REPORT]  # the start asks every live worker
    used = time.time()
    warm = SessionEvent(EventKind.WARM, "w1", "local/s1", 20, 4096, used)
    decoded.xadd(keys.KV_EVENTS, codec.fields(warm))
    store.step(block=False)

    def tier() -> tuple[str, str]:
        record = decoded.hgetall(keys.session_key("local", "s1"))
        return record.get("tier", ""), record.get("worker", "")

    assert tier() == ("warm", "w1")
    decoded.delete(keys.heartbeat_key("w1"))
    wait_for(lambda: store.step(block=False) >= 0 and tier() == ("gone", ""), "s1 lost")
    assert orders(decoded, "w1") == [OrderOp.REPORT]  # nothing asked while it is gone
    beat(decoded, "w1")
    wait_for(
        lambda: store.step(block=False) >= 0 and len(orders(decoded, "w1")) == 2,
        lambda: f"w1 asked again: {orders(decoded, 'w1')}",
    )
    assert orders(decoded, "w1") == [OrderOp.REPORT, OrderOp.REPORT]
    decoded.delete(keys.heartbeat_key("w1"))  # gone again, and back as a new process
    wait_for(lambda: store.step(block=False) >= 0 and tier() == ("gone", ""), "s1 lost")
    beat(decoded, "w1", pid=101)
    wait_for(lambda: store.step(block=False) >= 0 and "w1" in store.index.alive, "w1 back")
    assert len(orders(decoded, "w1")) == 2  # a new process reports by itself when it starts
    held = (Held("local/s1", "warm", 20, 4096, used),)
    inventory = SessionEvent(EventKind.INVENTORY, "w1", last_used=time.time(), held=held)
    decoded.xadd(keys.KV_EVENTS, codec.fields(inventory))
    assert store.step(block=False) == 1
    assert tier() == ("warm", "w1")


def test_after_a_lost_connection_the_kvstore_reads_again_what_was_delivered_to_it(
    decoded: redis_lib.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis delivered an event to the kvstore's consumer, and the connection broke before
    the reply came back: after the connection is back, the kvstore rebuilds and reads its
    pending events again, so the event is not left unapplied."""
    beat(decoded, "w1")
    store = KVStore(decoded, tmp_path / "spill", disk_budget=None, block_ms=10)
    store.start()
    warm = SessionEvent(EventKind.WARM, "w1", "local/s1", 20, 4096, time.time())
    decoded.xadd(keys.KV_EVENTS, codec.fields(warm))
    decoded.xreadgroup(keys.KV_GROUP, "kvstore", {keys.KV_EVENTS: ">"})  # its lost reply
    step = store.step
    failures = [redis_lib.ConnectionError("Connection closed by server.")]

    def broken_once(*, block: bool = True) -> int:
        if failures:
            raise failures.pop()
        return step(block=block)

    def tier() -> str:
        return decoded.hget(keys.session_key("local", "s1"), "tier") or ""

    monkeypatch.setattr(store, "step", broken_once)
    loop = threading.Thread(target=store.run)
    loop.start()
    try:
        wait_for(lambda: tier() == "warm", lambda: f"s1 applied: {tier()!r}")
    finally:
        store.stopping.set()
        loop.join(timeout=30)
    assert decoded.xpending(keys.KV_EVENTS, keys.KV_GROUP)["pending"] == 0
