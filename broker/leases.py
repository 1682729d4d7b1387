"""Leases on the entries a worker has taken: renewed while it runs them, taken over when it
dies. A worker renews its pending entries (XCLAIM to itself) while it runs them; entries
whose lease lapsed on its own stream (a previous process with its id) are claimed back, and
the whole pinned stream of a dead worker (no heartbeat) is adopted by a live one."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from broker import codec, keys
from broker.messages import ControlOrder, Job
from common.errors import ProtocolError

log = logging.getLogger("warmfleet.worker")


@dataclass(slots=True)
class Delivery:
    """One stream entry this worker has taken: a job, an order from the kvstore, or (when
    it cannot be read) neither, with the reason in `error`."""

    stream: str
    entry_id: str
    job: Job | None = None
    order: ControlOrder | None = None
    error: str = ""


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
            if self.r.set(keys.adopt_lock(dead), self.worker_id, nx=True, ex=30):
                taken += self._adopt(dead, limit - len(taken))
        return taken

    def _autoclaim(self, stream: str, min_idle_ms: int, count: int) -> list[Delivery]:
        if count <= 0:
            return []
        reply = self.r.xautoclaim(
            stream, keys.GROUP, self.worker_id, min_idle_ms, "0-0", count=count
        )
        return parse_entries([(stream, reply[1])])

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
        taken += parse_entries(reply or [])
        pending = self.r.xpending(stream, keys.GROUP)["pending"]
        if not taken and self.r.xlen(stream) == pending == 0:
            self.r.delete(stream)
            self.r.srem(keys.WORKERS, dead)
        return taken
