"""The kvstore's loop on a real Redis, without workers: what it does with commands it cannot
read."""

from __future__ import annotations

import json
import time
from pathlib import Path

import redis as redis_lib

from broker import codec, keys
from broker.messages import (
    AnswerStatus,
    CommandAnswer,
    CommandOp,
    ControlOrder,
    EventKind,
    KVCommand,
    OrderOp,
    SessionEvent,
)
from kvstore.service import KVStore
from tests.cluster_fixtures import decoded_client, redis_client, redis_server  # noqa: F401


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
    decoded.set(keys.heartbeat_key("w9"), json.dumps({"warm_budget": 1 << 20}))
    warm = SessionEvent(EventKind.WARM, "w9", "local/s1", 20, 4096, time.time())
    decoded.xadd(keys.KV_EVENTS, codec.fields(warm))
    reply_to = keys.reply_key("t2")
    delete = KVCommand(CommandOp.DELETE, "local/s1", reply_to, deadline=time.time() + 30)
    decoded.xadd(keys.KV_EVENTS, codec.fields(delete))
    assert store.step(block=False) == 2
    (entry,) = decoded.xrange(keys.pinned_stream("w9"))
    order = codec.decode(entry[1][codec.FIELD], ControlOrder)
    assert (order.op, order.key, order.reply_to) == (OrderOp.DROP, "local/s1", reply_to)
    assert decoded.llen(reply_to) == 0  # the worker's event answers it, once it has dropped
