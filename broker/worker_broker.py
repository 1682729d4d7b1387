"""The worker's side of the Redis protocol: read requests, publish tokens, hold leases."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

import redis

from broker import fair_queue, keys
from broker.fair_queue import Rooms
from broker.kv_events import HOT, KVEvent
from broker.wire import Control, Fields, WireRequest

OUT_STREAM_TTL_S = 300  # a finished request's tokens stay readable this long
# the kvstore deletes what it has applied; this bounds the stream while it is down (a
# kvstore that missed events rebuilds from the workers' inventories and the disk)
KV_EVENTS_MAXLEN = 1_000_000
AFFINITY_TTL_S = 600  # the index has long caught up by then


@dataclass(frozen=True, slots=True)
class Beat:
    """What one heartbeat learned."""

    rejoined: bool  # the worker was no longer registered: Redis lost its state, or the
    # worker had been taken for dead (its entries were handed to another worker)
    kvstore_alive: bool


class LostState(Exception):
    """Redis no longer holds this worker's consumer groups (it restarted without
    persistence): the worker must register again and forget the entries it held."""


def is_lost_group(e: redis.ResponseError) -> bool:
    """A consumer group (or its stream) is gone; also when a pipeline reports it."""
    return "NOGROUP" in str(e)


@dataclass(slots=True)
class Delivery:
    """One stream entry this worker has taken: a request or a control order."""

    stream: str
    entry_id: str
    request: WireRequest | None
    control: Control | None = None


def _parse(stream: str, entry_id: str, fields: Fields) -> Delivery:
    if "op" in fields:
        return Delivery(stream, entry_id, None, Control.decode(fields))
    return Delivery(stream, entry_id, WireRequest.decode(fields))


class WorkerBroker:
    """Requests come from the worker's pinned stream and the shared streams (consumer group
    `workers`, consumer = worker id). An entry stays pending until the worker acks it at the
    end of the request; a worker renews its entries' leases while it runs them, and entries
    whose lease lapsed (their worker died) are claimed again by a live worker."""

    def __init__(self, r: redis.Redis, worker_id: str, lease_s: float) -> None:
        self.r = r
        self.worker_id = worker_id
        self.lease_ms = int(lease_s * 1000)
        self.pinned = keys.pinned_stream(worker_id)
        self.streams = [self.pinned]
        self._dispatch = fair_queue.register_dispatch(r)
        self._hand_over = r.register_script(fair_queue.HAND_OVER)

    def _ensure_group(self, stream: str) -> None:
        try:
            self.r.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    def register(self, status: dict[str, object], ttl_s: float) -> None:
        """Create the consumer groups if they are missing (a new Redis), and join: heartbeat
        and membership together (a member without a heartbeat counts as dead), no longer
        draining."""
        for stream in (self.pinned, keys.WAKE):
            self._ensure_group(stream)
        pipe = self.r.pipeline(transaction=True)
        pipe.set(keys.heartbeat_key(self.worker_id), json.dumps(status), px=int(ttl_s * 1000))
        pipe.sadd(keys.WORKERS, self.worker_id)
        pipe.delete(keys.draining_key(self.worker_id))
        pipe.execute()

    def beat(self, status_json: str, ttl_s: float, renew: Iterable[Delivery]) -> Beat:
        """One round trip from the liveness thread: refresh the heartbeat and membership,
        renew the leases of `renew`, and see whether the kvstore runs. Raises LostState when
        the consumer groups are gone."""
        pipe = self.r.pipeline(transaction=False)
        pipe.set(keys.heartbeat_key(self.worker_id), status_json, px=int(ttl_s * 1000))
        pipe.sadd(keys.WORKERS, self.worker_id)
        pipe.exists(keys.KVSTORE_HEARTBEAT)
        self._queue_renew(pipe, renew)
        results = pipe.execute(raise_on_error=False)
        for result in results:
            if isinstance(result, redis.ResponseError) and is_lost_group(result):
                raise LostState(str(result))
            if isinstance(result, Exception):
                raise result
        added, kvstore = results[1], results[2]
        return Beat(rejoined=bool(added), kvstore_alive=bool(kvstore))

    def set_draining(self) -> None:
        """From now on no request is routed here (ENQUEUE and DISPATCH skip this worker)."""
        self.r.set(keys.draining_key(self.worker_id), "1")

    def unregister(self) -> None:
        pipe = self.r.pipeline(transaction=False)
        pipe.delete(keys.heartbeat_key(self.worker_id))
        pipe.srem(keys.WORKERS, self.worker_id)
        pipe.delete(keys.draining_key(self.worker_id))
        pipe.xlen(self.pinned)
        if pipe.execute()[-1] == 0:
            self.r.delete(self.pinned)

    def read(self, rooms: Rooms, block_ms: int | None) -> list[Delivery]:
        """The entries on the pinned stream, after moving requests from the fair queues
        onto it as `rooms` allow. With none, waits up to block_ms for a request to be
        queued (an entry on the wake stream) or pinned, then tries once more."""
        count = max(rooms)
        if count <= 0:
            return []
        taken = self._dispatch_and_read(rooms)
        if taken or not block_ms:
            return taken
        reply = self.r.xreadgroup(
            keys.GROUP,
            self.worker_id,
            {self.pinned: ">", keys.WAKE: ">"},
            count=count,
            block=block_ms,
        )
        wakes = [eid for s, entries in reply or [] if s == keys.WAKE for eid, _ in entries]
        taken = [
            _parse(s, eid, f) for s, entries in reply or [] if s != keys.WAKE for eid, f in entries
        ]
        if taken and not wakes:
            return taken
        left = (rooms[0] - len(taken), rooms[1] - len(taken), rooms[2] - len(taken))
        return taken + self._dispatch_and_read(left, wakes)

    def _dispatch_and_read(self, rooms: Rooms, wakes: list[str] | None = None) -> list[Delivery]:
        """One round trip: ack the wake entries read, dispatch, read the pinned stream."""
        pipe = self.r.pipeline(transaction=False)
        if wakes:
            pipe.xack(keys.WAKE, keys.GROUP, *wakes)
            pipe.xdel(keys.WAKE, *wakes)
        if max(rooms) <= 0:
            pipe.execute()
            return []
        self._queue_dispatch(pipe, rooms)
        pipe.xreadgroup(keys.GROUP, self.worker_id, {self.pinned: ">"}, count=max(rooms))
        reply = pipe.execute()[-1]
        return [_parse(s, eid, f) for s, entries in reply or [] for eid, f in entries]

    def _queue_dispatch(self, pipe: redis.client.Pipeline, rooms: Rooms) -> None:
        self._dispatch(
            keys=[self.pinned, keys.QUEUED, keys.RUNNING],
            args=fair_queue.dispatch_args(rooms),
            client=pipe,
        )

    def _queue_renew(self, pipe: redis.client.Pipeline, deliveries: Iterable[Delivery]) -> None:
        """Reset the idle time of the entries this worker is running (its lease)."""
        by_stream: dict[str, list[str]] = {}
        for d in deliveries:
            by_stream.setdefault(d.stream, []).append(d.entry_id)
        for stream, ids in by_stream.items():
            pipe.xclaim(stream, keys.GROUP, self.worker_id, 0, ids, justid=True)

    def read_pinned(self, count: int) -> list[Delivery]:
        """New entries on the pinned stream, without dispatching or waiting (a draining
        worker still reads the kvstore's orders, and hands requests over)."""
        reply = self.r.xreadgroup(keys.GROUP, self.worker_id, {self.pinned: ">"}, count=count)
        return [_parse(s, eid, f) for s, entries in reply or [] for eid, f in entries]

    def hand_over(self, d: Delivery) -> str:
        """Move a request this (draining) worker has not started to the live worker with
        the shortest pinned stream; that worker's id, or "" when no other worker is live."""
        assert d.request is not None
        return str(
            self._hand_over(
                keys=[d.stream],
                args=[
                    d.entry_id,
                    d.request.encode()["body"],
                    keys.heartbeat_key(""),
                    keys.pinned_stream(""),
                    keys.WORKERS,
                    keys.draining_key(""),
                    self.worker_id,
                    keys.GROUP,
                ],
            )
        )

    def reclaim(self, limit: int) -> list[Delivery]:
        """Entries whose lease lapsed, and the whole pinned stream of any dead worker."""
        # entries on our own stream whose lease lapsed: a previous process with our id
        taken = self._autoclaim(self.pinned, self.lease_ms, limit)
        for dead in self._dead_workers():
            if len(taken) >= limit:
                break
            if self.r.set(keys.adopt_lock(dead), self.worker_id, nx=True, ex=30):
                taken += self._adopt(dead, limit - len(taken))
        return taken

    def _autoclaim(self, stream: str, min_idle_ms: int, count: int) -> list[Delivery]:
        if count <= 0:
            return []
        reply = self.r.xautoclaim(
            stream, keys.GROUP, self.worker_id, min_idle_ms, "0-0", count=count
        )
        return [_parse(stream, eid, f) for eid, f in reply[1] if f]

    def _dead_workers(self) -> list[str]:
        others = sorted(w for w in self.r.smembers(keys.WORKERS) if w != self.worker_id)
        if not others:
            return []
        pipe = self.r.pipeline(transaction=False)
        for w in others:
            pipe.exists(keys.heartbeat_key(w))
        return [w for w, alive in zip(others, pipe.execute(), strict=True) if not alive]

    def _adopt(self, dead: str, limit: int) -> list[Delivery]:
        """Take a dead worker's pending and undelivered pinned entries, then retire it."""
        stream = keys.pinned_stream(dead)
        if not self.r.exists(stream):
            self.r.srem(keys.WORKERS, dead)
            return []
        taken = self._autoclaim(stream, 0, limit)
        reply = self.r.xreadgroup(keys.GROUP, self.worker_id, {stream: ">"}, count=limit)
        taken += [_parse(stream, eid, f) for _, entries in reply or [] for eid, f in entries]
        pending = self.r.xpending(stream, keys.GROUP)["pending"]
        if not taken and self.r.xlen(stream) == pending == 0:
            self.r.delete(stream)
            self.r.srem(keys.WORKERS, dead)
        return taken

    def publish(
        self,
        events: list[tuple[str, Fields]],
        acks: list[Delivery],
        kv_events: list[KVEvent],
        watch: list[str],
        status: tuple[dict[str, object], float] | None = None,
        rooms: Rooms = (0, 0, 0),
    ) -> tuple[list[str], list[Delivery]]:
        """One round trip: out-stream events, acks of finished entries, session events for
        the kvstore, a fresh heartbeat (status, ttl) when given, which of `watch` were
        cancelled, and the new entries `rooms` allow (read without blocking, so a busy
        worker admits in the same round trip)."""
        pipe = self.r.pipeline(transaction=False)
        if status is not None:
            hb = json.dumps(status[0])
            pipe.set(keys.heartbeat_key(self.worker_id), hb, px=int(status[1] * 1000))
        for request_id, fields in events:
            stream = keys.out_stream(request_id)
            pipe.xadd(stream, fields)
            if fields["k"] != "chunk":
                pipe.expire(stream, OUT_STREAM_TTL_S)
        for d in acks:
            pipe.xack(d.stream, keys.GROUP, d.entry_id)
            pipe.xdel(d.stream, d.entry_id)
            if d.request is not None:  # it ended: its tenant runs one request fewer
                pipe.hincrby(keys.RUNNING, d.request.tenant, -1)
        for e in kv_events:
            pipe.xadd(keys.KV_EVENTS, e.encode(), maxlen=KV_EVENTS_MAXLEN, approximate=True)
            if e.kind == HOT:  # routes the session's next turn here before the index does
                affinity = keys.affinity_key(*keys.split_cache_key(e.key))
                pipe.set(affinity, self.worker_id, ex=AFFINITY_TTL_S)
        if watch:
            pipe.mget([keys.cancel_key(rid) for rid in watch])
        if max(rooms) > 0:
            self._queue_dispatch(pipe, rooms)
            pipe.xreadgroup(keys.GROUP, self.worker_id, {self.pinned: ">"}, count=max(rooms))
        results = pipe.execute()
        read = None
        if max(rooms) > 0:
            read = results.pop()
            results.pop()  # how many the dispatch moved onto our stream
        cancelled = (
            [rid for rid, flag in zip(watch, results[-1], strict=True) if flag] if watch else []
        )
        return cancelled, [_parse(s, eid, f) for s, entries in read or [] for eid, f in entries]
