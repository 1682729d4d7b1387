"""The worker's side of the Redis protocol: join, read jobs and orders, publish each step's
results in one round trip."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis

from broker import codec, fair_queue, keys, placement
from broker.fair_queue import Rooms
from broker.leases import Delivery, Leases, is_lost_group, parse_entries
from broker.messages import Completion, ControlOrder, EventKind, JobError, SessionEvent, TokenChunk
from broker.pipeline import Sections
from broker.streams import ensure_group

OUT_STREAM_TTL_S = 300  # a finished request's tokens stay readable this long
# the kvstore deletes what it has applied; this bounds the stream while it is down (a
# kvstore that missed events rebuilds from the workers' inventories and the disk)
KV_EVENTS_MAXLEN = 1_000_000
AFFINITY_TTL_S = 600  # the index has long caught up by then

# An entry whose request ended leaves its stream, and its tenant (ARGV[3], "" for an order)
# runs one request fewer. A request taken over from a worker taken for dead may end on two
# workers: only the one whose XDEL removed the entry counts it, and gives back to the
# tenant's virtual finish time what the request was charged (DISPATCH's charge hash) beyond
# the tokens it used.
# KEYS: the stream, keys.RUNNING, the request's charge hash ("wf:charge:" for an order).
# ARGV: group, entry id, tenant, tokens used.
END = """
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if redis.call('XDEL', KEYS[1], ARGV[2]) == 1 then
  if ARGV[3] ~= '' then
    redis.call('HINCRBY', KEYS[2], ARGV[3], -1)
  end
  local c = redis.call('HMGET', KEYS[3], 's', 'a', 't', 'c', 'w')
  if c[1] then  -- dispatched from a fair queue: give back what it did not use
    local refund = math.max(0, tonumber(c[4]) - tonumber(ARGV[4])) / tonumber(c[5])
    if refund > 0 then
      redis.call('HINCRBYFLOAT', c[1], c[3], -refund)
      if redis.call('ZSCORE', c[2], c[3]) then
        redis.call('ZINCRBY', c[2], -refund, c[3])
      end
    end
    redis.call('DEL', KEYS[3])
  end
end
return 0
"""

__all__ = ["Beat", "Delivery", "LostState", "Outbox", "WorkerBroker", "is_lost_group"]


@dataclass(frozen=True, slots=True)
class Beat:
    """What one heartbeat learned."""

    rejoined: bool  # the worker was no longer registered: Redis lost its state, or the
    # worker had been taken for dead (its entries were handed to another worker)
    kvstore_alive: bool


class LostState(Exception):
    """Redis no longer holds this worker's consumer groups (it restarted without
    persistence): the worker must register again and forget the entries it held."""


@dataclass(slots=True)
class Outbox:
    """Everything one pass publishes, sent in one round trip."""

    results: list[tuple[str, TokenChunk | Completion | JobError]] = field(default_factory=list)
    acks: list[Delivery] = field(default_factory=list)  # entries whose request ended
    # tokens each ended request used (prompt + generated), by request id; one not here used
    # none: the fair queues give back the rest of what they charged
    used_tokens: dict[str, int] = field(default_factory=dict)
    events: list[SessionEvent] = field(default_factory=list)  # for the kvstore
    orders: list[tuple[str, ControlOrder]] = field(default_factory=list)  # to other workers


class WorkerBroker(Leases):
    """Jobs reach a worker on its pinned stream (consumer group `workers`, consumer = the
    worker id): routed there for a warm session, or moved there from the fair queues by
    the worker's own DISPATCH, which leaves them to a less loaded live worker and wakes it
    (see broker/fair_queue.py, Placement). An entry stays pending until the worker acks it
    at the end of the request; see Leases for what happens when a worker dies."""

    def __init__(self, r: redis.Redis, worker_id: str, lease_s: float) -> None:
        super().__init__(r, worker_id, lease_s)
        self.wake = keys.worker_wake(worker_id)  # another worker leaves it a request
        self._dispatch = r.register_script(fair_queue.DISPATCH)
        self._hand_over = r.register_script(placement.HAND_OVER)
        self._end = r.register_script(END)

    def register(self, status: dict[str, object], ttl_s: float) -> None:
        """Create the consumer groups if they are missing (a new Redis), and join: heartbeat
        and membership together (a member without a heartbeat counts as dead), no longer
        draining."""
        for stream in (self.pinned, keys.WAKE, self.wake):
            ensure_group(self.r, stream, keys.GROUP)
        pipe = self.r.pipeline(transaction=True)
        pipe.set(keys.heartbeat_key(self.worker_id), json.dumps(status), px=int(ttl_s * 1000))
        pipe.sadd(keys.WORKERS, self.worker_id)
        pipe.delete(keys.draining_key(self.worker_id))
        pipe.execute()

    def beat(self, status_json: str, ttl_s: float, renew: Iterable[Delivery]) -> Beat:
        """One round trip from the liveness thread: refresh the heartbeat and membership,
        renew the leases of `renew`, and see whether the kvstore runs. Raises LostState when
        the consumer groups are gone."""
        rt = Sections(self.r)
        with rt.section("heartbeat") as pipe:
            pipe.set(keys.heartbeat_key(self.worker_id), status_json, px=int(ttl_s * 1000))
        with rt.section("member") as pipe:
            pipe.sadd(keys.WORKERS, self.worker_id)
        with rt.section("kvstore") as pipe:
            pipe.exists(keys.KVSTORE_HEARTBEAT)
        with rt.section("renew") as pipe:
            self.queue_renew(pipe, renew)
        rt.execute(raise_on_error=False)
        for result in rt.results("renew") + rt.results("heartbeat"):
            if isinstance(result, redis.ResponseError) and is_lost_group(result):
                raise LostState(str(result))
            if isinstance(result, Exception):
                raise result
        (added,), (kvstore,) = rt.results("member"), rt.results("kvstore")
        return Beat(rejoined=bool(added), kvstore_alive=bool(kvstore))

    def set_draining(self) -> None:
        """From now on no request is routed here (ENQUEUE and DISPATCH skip this worker)."""
        self.r.set(keys.draining_key(self.worker_id), "1")

    def unregister(self) -> None:
        pipe = self.r.pipeline(transaction=False)
        pipe.delete(keys.heartbeat_key(self.worker_id))
        pipe.srem(keys.WORKERS, self.worker_id)
        pipe.delete(keys.draining_key(self.worker_id))
        pipe.delete(self.wake)
        pipe.xlen(self.pinned)
        if pipe.execute()[-1] == 0:
            self.r.delete(self.pinned)

    def read(self, rooms: Rooms, block_ms: int | None) -> list[Delivery]:
        """The entries on the pinned stream, after moving jobs from the fair queues onto it
        as `rooms` allow. With none, waits up to block_ms for a job to be queued (an entry
        on the wake stream, or on its own when another worker leaves it one) or pinned, then
        tries once more."""
        count = max(rooms)
        if count <= 0:
            return []
        taken = self._dispatch_and_read(rooms)
        if taken or not block_ms:
            return taken
        reply = self.r.xreadgroup(
            keys.GROUP, self.worker_id, {self.pinned: ">", keys.WAKE: ">", self.wake: ">"},
            count=count, block=block_ms,
        )  # fmt: skip
        wakes = [(s, [eid for eid, _ in e]) for s, e in reply or [] if s != self.pinned]
        taken = parse_entries([(s, e) for s, e in reply or [] if s == self.pinned])
        if taken and not wakes:
            return taken
        left = (rooms[0] - len(taken), rooms[1] - len(taken), rooms[2] - len(taken))
        return taken + self._dispatch_and_read(left, wakes)

    def _dispatch_and_read(
        self, rooms: Rooms, wakes: list[tuple[str, list[str]]] | None = None
    ) -> list[Delivery]:
        """One round trip: ack the wake entries read (by stream), dispatch, read the pinned
        stream."""
        rt = Sections(self.r)
        with rt.section("wakes") as pipe:
            for stream, ids in wakes or []:
                pipe.xack(stream, keys.GROUP, *ids)
                pipe.xdel(stream, *ids)
        self._queue_take(rt, rooms)
        rt.execute()
        (read,) = rt.results("read") or [None]
        return parse_entries(read or [])

    def _queue_take(self, rt: Sections, rooms: Rooms) -> None:
        """Sections "dispatch" (DISPATCH as `rooms` allow) and "read" (the pinned stream)."""
        if max(rooms) <= 0:
            return
        with rt.section("dispatch") as pipe:
            self._dispatch(
                keys=[self.pinned, keys.QUEUED, keys.RUNNING],
                args=fair_queue.dispatch_args(rooms, self.worker_id),
                client=pipe,
            )
        with rt.section("read") as pipe:
            pipe.xreadgroup(keys.GROUP, self.worker_id, {self.pinned: ">"}, count=max(rooms))

    def read_pinned(self, count: int) -> list[Delivery]:
        """New entries on the pinned stream, without dispatching or waiting (a draining
        worker still reads the kvstore's orders, and hands jobs over)."""
        reply = self.r.xreadgroup(keys.GROUP, self.worker_id, {self.pinned: ">"}, count=count)
        return parse_entries(reply or [])

    def hand_over(self, d: Delivery) -> str:
        """Move a job this (draining) worker has not started to the live worker placement
        ranks first (broker/placement.py); its id, or "" when no other worker is live."""
        assert d.job is not None
        args = [d.entry_id, codec.encode(d.job), keys.heartbeat_key(""), keys.pinned_stream("")]
        args += [keys.WORKERS, keys.draining_key(""), self.worker_id, keys.GROUP]
        return str(self._hand_over(keys=[d.stream], args=args))

    def publish(
        self,
        out: Outbox,
        watch: list[str],
        status: tuple[dict[str, object], float] | None = None,
        rooms: Rooms = (0, 0, 0),
    ) -> tuple[list[str], list[Delivery]]:
        """One round trip: results on the jobs' out streams, acks of ended jobs, session
        events for the kvstore, a fresh heartbeat (status, ttl) when given; back come which
        of `watch` were cancelled and the new entries `rooms` allow (read without blocking,
        so a busy worker admits in the same round trip)."""
        rt = Sections(self.r)
        if status is not None:
            with rt.section("status") as pipe:
                hb = json.dumps(status[0])
                pipe.set(keys.heartbeat_key(self.worker_id), hb, px=int(status[1] * 1000))
        with rt.section("results") as pipe:
            self._queue_results(pipe, out)
        with rt.section("events") as pipe:
            self._queue_events(pipe, out.events)
            for worker, order in out.orders:
                pipe.xadd(keys.pinned_stream(worker), codec.fields(order))
        with rt.section("cancelled") as pipe:
            if watch:
                pipe.mget([keys.cancel_key(rid) for rid in watch])
        self._queue_take(rt, rooms)
        rt.execute()
        (flags,) = rt.results("cancelled") or [[]]
        (read,) = rt.results("read") or [None]
        cancelled = [rid for rid, flag in zip(watch, flags, strict=True) if flag] if watch else []
        return cancelled, parse_entries(read or [])

    def _queue_results(self, pipe: redis.client.Pipeline, out: Outbox) -> None:
        for request_id, message in out.results:
            stream = keys.out_stream(request_id)
            pipe.xadd(stream, codec.fields(message))
            if not isinstance(message, TokenChunk):
                pipe.expire(stream, OUT_STREAM_TTL_S)
        for d in out.acks:
            rid, tenant = (d.job.request_id, d.job.tenant) if d.job is not None else ("", "")
            used = out.used_tokens.get(rid, 0)
            self._end(keys=[d.stream, keys.RUNNING, keys.fair_charge(rid)],
                      args=[keys.GROUP, d.entry_id, tenant, used], client=pipe)  # fmt: skip

    def _queue_events(self, pipe: redis.client.Pipeline, events: list[SessionEvent]) -> None:
        for e in events:
            pipe.xadd(keys.KV_EVENTS, codec.fields(e), maxlen=KV_EVENTS_MAXLEN, approximate=True)
            if e.kind == EventKind.HOT:  # routes the session's next turn before the index does
                affinity = keys.affinity_key(*keys.split_cache_key(e.key))
                pipe.set(affinity, self.worker_id, ex=AFFINITY_TTL_S)
