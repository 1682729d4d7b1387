"""Events applied once across a kvstore restart: two kvstore service objects on a real Redis,
the first taken as SIGKILLed at the point where it has applied a batch of events in memory
and not yet acknowledged it (its transaction not sent, or sent and landing late), the
second the kvstore started again. The counters and the index in Redis count each event
once."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib

from broker import codec, keys
from broker.messages import EventKind, SessionEvent
from kvstore.effects import Effects
from kvstore.service import KVStore
from kvstore.writer import IndexWriter
from tests.cluster_fixtures import decoded_client, redis_client, redis_server  # noqa: F401

SESSIONS = [f"s{i}" for i in range(3)]


class Killed(BaseException):
    """Stands for the SIGKILL at the point it is raised."""


def started(r: redis_lib.Redis, spill: Path) -> KVStore:
    store = KVStore(r, spill, disk_budget=None, block_ms=10)
    store.start()
    return store


def spill_events(r: redis_lib.Redis) -> list[str]:
    """A worker's report that each session's file is written: one spill each."""
    ids = []
    for sid in SESSIONS:
        key = f"local/{sid}"
        e = SessionEvent(EventKind.DISK, "w1", key, 20, 4096, time.time(), file_mtime_ns=1)
        ids.append(r.xadd(keys.KV_EVENTS, codec.fields(e)))
    return ids


def killed_in_step(
    store: KVStore, in_flight: list[tuple[Effects, list[str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step `store` to the commit of its batch, and kill it there (the batch kept, as the
    transaction that would carry it)."""

    def kill(fx: Effects, entry_ids: list[str]) -> None:
        if entry_ids:
            in_flight.append((fx, entry_ids))
            raise Killed
        IndexWriter.commit(store.writer, fx, entry_ids)

    monkeypatch.setattr(store.writer, "commit", kill)
    with pytest.raises(Killed):
        store.step(block=False)


def assert_applied_once(r: redis_lib.Redis, last_id: str) -> None:
    assert r.hget(keys.KV_STATS, "spills") == str(len(SESSIONS))
    tiers = [r.hget(keys.session_key("local", sid), "tier") for sid in SESSIONS]
    assert tiers == ["disk"] * len(SESSIONS)
    assert r.get(keys.KV_APPLIED) == last_id
    assert r.xlen(keys.KV_EVENTS) == 0  # acknowledged and deleted
    assert r.xpending(keys.KV_EVENTS, keys.KV_GROUP)["pending"] == 0


def test_a_batch_applied_but_not_acknowledged_is_applied_once_by_the_next_kvstore(
    decoded: redis_lib.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = started(decoded, tmp_path)
    ids = spill_events(decoded)
    in_flight: list[tuple[Effects, list[str]]] = []
    killed_in_step(first, in_flight, monkeypatch)
    assert sorted(first.index.table.records) == [f"local/{sid}" for sid in SESSIONS]  # applied
    assert decoded.hget(keys.KV_STATS, "spills") is None  # and nothing of it written
    assert decoded.xpending(keys.KV_EVENTS, keys.KV_GROUP)["pending"] == len(ids)
    started(decoded, tmp_path)  # reads the pending batch again
    assert_applied_once(decoded, ids[-1])


def test_the_killed_kvstores_transaction_landing_after_the_restart_writes_nothing(
    decoded: redis_lib.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its transaction was on the wire when it died, and reached Redis after the new
    kvstore had applied the same pending batch."""
    first = started(decoded, tmp_path)
    ids = spill_events(decoded)
    in_flight: list[tuple[Effects, list[str]]] = []
    killed_in_step(first, in_flight, monkeypatch)
    started(decoded, tmp_path)
    ((fx, entry_ids),) = in_flight
    with pytest.raises(redis_lib.WatchError, match="applied-events marker"):
        IndexWriter.commit(first.writer, fx, entry_ids)
    assert_applied_once(decoded, ids[-1])


def test_a_restart_between_the_killed_kvstores_check_and_its_exec_aborts_it(
    decoded: redis_lib.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It had checked the marker (WATCH) when the new kvstore applied the batch: its EXEC
    is refused by Redis."""
    first = started(decoded, tmp_path)
    ids = spill_events(decoded)
    queue: Callable[..., Any] = first.writer._queue

    def restart_then_queue(*args: Any) -> None:
        started(decoded, tmp_path)  # the marker moves after the first one's WATCH
        queue(*args)

    monkeypatch.setattr(first.writer, "_queue", restart_then_queue)
    with pytest.raises(redis_lib.WatchError):
        first.step(block=False)
    assert_applied_once(decoded, ids[-1])
    first.rebuild()  # as its loop does next: its picture becomes Redis's (no file is
    assert first.writer.marker == ids[-1]  # there, so each session is now gone in both)
    in_redis = {
        f"local/{sid}": decoded.hget(keys.session_key("local", sid), "tier") for sid in SESSIONS
    }
    assert {k: str(r.tier) for k, r in first.index.table.records.items()} == in_redis
    assert set(in_redis.values()) == {"gone"}
