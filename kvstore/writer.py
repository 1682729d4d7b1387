"""What applying events asks (Effects) carried out in Redis: the records, prefix marks,
orders, counters and replies, the events' acknowledgement and the applied-events marker in
one transaction.

The marker (`wf:kv:applied`) is the id of the last event applied. Every write is
conditional on it still being the one this kvstore last wrote or read: if another kvstore
applied events since (a restarted one, while this one's last batch was still in flight), or
Redis lost what this one wrote, this kvstore's picture is not Redis's any more, and it
writes nothing (redis.WatchError) rather than apply those events a second time.
"""

from __future__ import annotations

from collections.abc import Callable

import redis
from redis.client import Pipeline

from broker import codec, keys, prompt_heads
from broker.kv_commands import REPLY_TTL_S
from broker.messages import AnswerStatus, CommandAnswer
from engine.kv_files.spill_file import read_summary, spill_path
from kvstore.disk_sweep import DiskSweep
from kvstore.effects import Effects


class IndexWriter:
    def __init__(self, r: redis.Redis, sweep: DiskSweep, any_worker: Callable[[], str]) -> None:
        self.r = r
        self.sweep = sweep
        self.any_worker = any_worker  # a live worker for an order any worker can carry out
        self.marker: str | None = None  # wf:kv:applied as this kvstore last wrote or read it

    def load_marker(self) -> None:
        """Take the marker Redis holds as this kvstore's own (at a start, before the index
        is read)."""
        self.marker = self.r.get(keys.KV_APPLIED)

    def commit(self, fx: Effects, entry_ids: list[str]) -> None:
        """Carry out `fx` and acknowledge `entry_ids` in one transaction (files between the
        marker's check and the transaction: deleting one twice after a crash does no harm).
        Raises redis.WatchError, having written nothing, when the marker moved."""
        if not entry_ids and fx.is_empty():
            return
        with self.r.pipeline(transaction=True) as pipe:
            pipe.watch(keys.KV_APPLIED)
            found = pipe.get(keys.KV_APPLIED)
            if found != self.marker:
                raise redis.WatchError(
                    f"the applied-events marker is {found!r}, not {self.marker!r}: another "
                    "kvstore applied events, or Redis lost what this one wrote"
                )
            for key, mtime_ns in fx.unlink:
                self._unlink(key, mtime_ns)
            pipe.multi()
            self._queue(pipe, fx)
            if entry_ids:
                pipe.set(keys.KV_APPLIED, entry_ids[-1])
                pipe.xack(keys.KV_EVENTS, keys.KV_GROUP, *entry_ids)
                pipe.xdel(keys.KV_EVENTS, *entry_ids)
            pipe.execute()
        if entry_ids:
            self.marker = entry_ids[-1]

    def _queue(self, pipe: Pipeline, fx: Effects) -> None:
        for key, record in fx.upserts.items():
            tenant, session_id = keys.split_cache_key(key)
            pipe.hset(keys.session_key(tenant, session_id), mapping=record.to_fields())
            pipe.zadd(keys.session_index(tenant), {session_id: record.last_used})
            pipe.sadd(keys.TENANTS, tenant)
        for key in fx.removals:  # deleted: its record, and the hint that routes it
            tenant, session_id = keys.split_cache_key(key)
            pipe.delete(keys.session_key(tenant, session_id), keys.affinity_key(tenant, session_id))
            pipe.zrem(keys.session_index(tenant), session_id)
        replies = list(fx.replies)
        for o in fx.orders:
            worker = o.worker or self.any_worker()
            if worker:
                pipe.xadd(keys.pinned_stream(worker), codec.fields(o.order))
            elif o.order.reply_to:  # no worker to do it: the caller hears so at once
                answer = CommandAnswer(AnswerStatus.ERROR, message="no worker is running")
                replies.append((o.order.reply_to, answer))
        for key, marks in fx.marks.items():
            tenant, session_id = keys.split_cache_key(key)
            ttl, prefix = prompt_heads.MARK_TTL_S, prompt_heads.mark_prefix(tenant)
            for mark in marks[: prompt_heads.MAX_MARKS]:
                pipe.set(prefix + mark, session_id, ex=ttl)
        for name, n in fx.counters.items():
            pipe.hincrby(keys.KV_STATS, name, n)
        for reply_key, answer in replies:
            pipe.rpush(reply_key, codec.encode(answer))
            pipe.expire(reply_key, REPLY_TTL_S)

    def _unlink(self, key: str, mtime_ns: int) -> None:
        """Delete the session's file, unless it is a newer one than the index knew; the
        blocks no other file lists go at the next sweep."""
        path = spill_path(self.sweep.spill_dir, key)
        try:
            if mtime_ns and path.stat().st_mtime_ns != mtime_ns:
                return
            summary = read_summary(path)
            path.unlink()
        except FileNotFoundError:
            return
        if summary is not None:
            self.sweep.soon(summary.blocks)
