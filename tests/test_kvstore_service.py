"""The kvstore's loop on a real Redis, without workers: what it does with commands it cannot
read."""

from __future__ import annotations

import json
from pathlib import Path

import redis as redis_lib

from broker import codec, keys
from broker.messages import AnswerStatus, CommandAnswer
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
