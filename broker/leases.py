"""Leases on the entries a worker has taken: renewed while it runs them, taken over when it
dies. A worker renews its pending entries (XCLAIM to itself) while it runs them; entries
whose lease lapsed on its own stream (a previous process with its id) are claimed back, and
the whole pinned stream of a dead worker (no heartbeat) is adopted by a live one as soon as
its heartbeat lapses; the lease is the backstop."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from broker import codec, keys
from broker.messages import ControlOrder, Job
from broker.progress import Progress, read_progress
from common.errors import ProtocolError

log = logging.getLogger("warmfleet.worker")
ADOPT_LOCK_MS = 10_000  # one adopter at a time; released when done, this only if it died
ORPHAN_SCAN = 1000  # pending entries looked at per adoption
# A dead worker leaves the registry, its empty pinned stream and its wake stream go, unless
# it came back meanwhile (a restart re-registers at once: its new streams must stay).
# KEYS: its heartbeat, pinned stream, wake stream, keys.WORKERS. ARGV: its id.
RETIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('XLEN', KEYS[2]) > 0 then return 0 end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('SREM', KEYS[4], ARGV[1])
return 1
"""


@dataclass(slots=True)
class Delivery:
    """One stream entry this worker has taken: a job, an order from the kvstore, or (when
    it cannot be read) neither, with the reason in `error`."""

    stream: str
    entry_id: str
    job: Job | None = None
    order: ControlOrder | None = None
    error: str = ""
    progress: Progress = field(default_factory=Progress)  # a job taken over: its out stream


def parse_entries(reply: Iterable[Any]) -> list[Delivery]:
    """Deliveries from an XREADGROUP reply: [(stream, [(entry id, fields), ...]), ...]."""
    return [parse(stream, eid, f) for stream, entries in reply for eid, f in entries if f]


def parse(stream: str, entry_id: str, entry: dict[str, str]) -> Delivery:
    try:
        message = codec.decode_fields(entry, Job, ControlOrder)
    except ProtocolError as e:
        return Delivery(stream, entry_id, error=str(e))
    if isinstance(message, Job):
        return Delivery(stream, entry_id, job=message)
    return Delivery(stream, entry_id, order=message)


def is_lost_group(e: redis.ResponseError) -> bool:
    """A consumer group (or its stream) is gone; also when a pipeline reports it."""
    return "NOGROUP" in str(e)


class Leases:
    def __init__(self, r: redis.Redis, worker_id: str, lease_s: float) -> None:
        self.r = r
        self.worker_id = worker_id
        self.lease_ms = int(lease_s * 1000)
        self.pinned = keys.pinned_stream(worker_id)
        self._retire = r.register_script(RETIRE)

    def queue_renew(self, pipe: redis.client.Pipeline, deliveries: Iterable[Delivery]) -> None:
        """Reset the idle time of the entries this worker is running (its lease)."""
        by_stream: dict[str, list[str]] = {}
        for d in deliveries:
            by_stream.setdefault(d.stream, []).append(d.entry_id)
        for stream, ids in by_stream.items():
            pipe.xclaim(stream, keys.GROUP, self.worker_id, 0, ids, justid=True)

    def reclaim(self, limit: int) -> list[Delivery]:
        """Entries whose lease lapsed, and the whole pinned stream of any dead worker."""
        # entries on our own stream whose lease lapsed: a previous process with our id
        taken = self._autoclaim(self.pinned, self.lease_ms, limit)
        for dead in self._dead_workers():
            if len(taken) >= limit:
                break
            lock = keys.adopt_lock(dead)
            if self.r.set(lock, self.worker_id, nx=True, px=ADOPT_LOCK_MS):
                try:
                    taken += self._adopt(dead, limit - len(taken))
                finally:
                    self.r.delete(lock)
        return self._with_progress(taken)

    def _with_progress(self, taken: list[Delivery]) -> list[Delivery]:
        """Each job's progress, read from its out stream: an earlier worker may have sent
        some of its tokens, or all of it."""
        progress = read_progress(self.r, (d.job.request_id for d in taken if d.job))
        for d in taken:
            if d.job is not None:
                d.progress = progress[d.job.request_id]
        return taken

    def _autoclaim(self, stream: str, min_idle_ms: int, count: int) -> list[Delivery]:
        if count <= 0:
            return []
        reply = self.r.xautoclaim(
            stream, keys.GROUP, self.worker_id, min_idle_ms, "0-0", count=count
        )
        return parse_entries([(stream, reply[1])])

    def _dead_workers(self) -> list[str]:
        """Registered workers without a heartbeat. None while this worker's own heartbeat is
        missing too: then Redis (or this process) stalled, not the others."""
        others = sorted(w for w in self.r.smembers(keys.WORKERS) if w != self.worker_id)
        if not others:
            return []
        pipe = self.r.pipeline(transaction=False)
        for w in (self.worker_id, *others):
            pipe.exists(keys.heartbeat_key(w))
        mine, *alive = pipe.execute()
        return [w for w, a in zip(others, alive, strict=True) if not a] if mine else []

    def _adopt(self, dead: str, limit: int) -> list[Delivery]:
        """Take a dead worker's entries (those pending for a consumer without a heartbeat,
        any whose lease lapsed, the undelivered ones), then retire it once its stream is
        empty. Entries a live worker adopted earlier stay with it."""
        stream = keys.pinned_stream(dead)
        if not self.r.exists(stream):
            self._retire_if_dead(dead)
            return []
        taken = self._claim_orphans(stream, limit)
        taken += self._autoclaim(stream, self.lease_ms, limit - len(taken))
        if len(taken) < limit:
            reply = self.r.xreadgroup(
                keys.GROUP, self.worker_id, {stream: ">"}, count=limit - len(taken)
            )
            taken += parse_entries(reply or [])
        if not taken:
            self._retire_if_dead(dead)
        return taken

    def _retire_if_dead(self, dead: str) -> None:
        keys_ = [keys.heartbeat_key(dead), keys.pinned_stream(dead), keys.worker_wake(dead)]
        self._retire(keys=[*keys_, keys.WORKERS], args=[dead])

    def _claim_orphans(self, stream: str, limit: int) -> list[Delivery]:
        """The entries of `stream` pending for consumers with no heartbeat, claimed now
        (without waiting for their lease)."""
        if limit <= 0:
            return []
        pending = self.r.xpending_range(stream, keys.GROUP, "-", "+", ORPHAN_SCAN)
        consumers = sorted({p["consumer"] for p in pending} - {self.worker_id})
        if not consumers:
            return []
        pipe = self.r.pipeline(transaction=False)
        for c in consumers:
            pipe.exists(keys.heartbeat_key(c))
        gone = {c for c, alive in zip(consumers, pipe.execute(), strict=True) if not alive}
        ids = [p["message_id"] for p in pending if p["consumer"] in gone][:limit]
        if not ids:
            return []
        return parse_entries([(stream, self.r.xclaim(stream, keys.GROUP, self.worker_id, 0, ids))])
